#!/usr/bin/env bash
# CPU seconds of every running `slca train` process, sampled every ${EVERY:-60} s, appended to $1 as
# "<unix time> <pid> <run_dir> <cpu s (user + system of the process, all threads)>" (and, at each start, a line
# "# <unix time> cpu: <model name>, <cores> cores"). A run's CPU is the sum over its
# processes (a resumed run has several) of each process's last sample, so a run loses at most EVERY seconds of each
# process's CPU (the samples after its last one). For code that records no perf/cpu_s (study 42's frozen 493626c).
#   setsid nohup bash scripts/cpu_watch.sh docs/results/study42/cpu_watch.log > /dev/null 2>&1 < /dev/null &
set -u
out=$1
tck=$(getconf CLK_TCK)
# which CPU (runs of one study may land on machines of different kinds across sessions): a comment line per start
echo "# $(date +%s) cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores" >> "$out"
while true; do
  now=$(date +%s)
  for d in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null) || continue
    [[ $cmd == *"slca.cli train"* || $cmd == *"slca train"* ]] || continue
    run=$(sed -n 's/.*run_dir=\([^ ]*\).*/\1/p' <<< "$cmd")
    [[ -n $run ]] || continue
    stat=$(cat "$d/stat" 2>/dev/null) || continue
    read -r -a f <<< "${stat##*) }"
    echo "$now ${d#/proc/} $run $(( (f[11] + f[12]) / tck ))" >> "$out"
  done
  sleep "${EVERY:-60}"
done
