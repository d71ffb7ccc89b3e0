-- ARGV[8] life.
drop(ARGV[8])
return 1
