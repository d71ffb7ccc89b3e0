"""The aiohttp layer: app composition, relay handlers, middleware."""
