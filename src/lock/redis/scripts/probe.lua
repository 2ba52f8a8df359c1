-- A watcher's probe, put in front of inspect.lua or sem_inspect.lua: the
-- read that follows and this marker on the change channel are one atomic
-- step, so the watcher that hears the marker has heard every change made
-- before the read (see src/lock/watch.rs).
-- ARGV[1] change channel, ARGV[2] PUBLISH or SPUBLISH, ARGV[3] the marker
-- pcall: a server without SPUBLISH (Redis 6) still answers the read.
redis.pcall(ARGV[2], ARGV[1], 'probe ' .. ARGV[3])
