drop_all()
return 1
