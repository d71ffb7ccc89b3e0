-- ARGV[7] life.
drop(ARGV[7])
return 1
