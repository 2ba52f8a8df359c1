# Shell helpers the benchmarks share; source it: `. bench/lib.sh`.

# CPU ticks (user + system) a process has used so far, from /proc/PID/stat.
# The fields are counted after the command name's closing parenthesis, so
# a name with spaces in it does not shift them.
proc_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }

# The same in seconds of CPU.
proc_cpu_seconds() { echo "$(proc_ticks "$1")" "$(getconf CLK_TCK)" | awk '{ print $1 / $2 }'; }
