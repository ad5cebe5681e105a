#!/usr/bin/env bash
# Run a queue of fits, JOBS at a time with one thread each, from a fixed commit, resumably.
# Each line of QUEUE is a set of `phasefix.fit` overrides that includes run_name=...; a line whose run finished
# (marker $STATE/<run_name>.done) is skipped and one that was interrupted (its run directory $STATE/runs/<run_name>
# has a checkpoint) is resumed from it, so rerunning the same command continues the queue where it stopped.
# Run it from a `git worktree` of the commit being measured (recorded as the MLflow tag git_commit) and send the
# runs to the main checkout's tracking store:
#   git worktree add /work/wt-$(git rev-parse --short HEAD) HEAD
#   (cd /work/wt-... && TAG=hard_v2 TRACKING=sqlite:////work/main/mlruns/mlflow.db bash studies/queue.sh queue.txt)
# Usage: [JOBS=2] [TAG=name] [TRACKING=uri] [STATE=dir] bash studies/queue.sh QUEUE
set -euo pipefail -f  # -f: no globbing of [a,b] mitigation lists
QUEUE="$1"
JOBS="${JOBS:-2}"
STATE="${STATE:-$(dirname "$QUEUE")/queue-state}"
mkdir -p "$STATE"
COMMON="trainer.num_threads=1 trainer.progress_bar=false"
[ -n "${TAG:-}" ] && COMMON="$COMMON +logger.tags.comparison=$TAG"
[ -n "${TRACKING:-}" ] && COMMON="$COMMON logger.tracking_uri=$TRACKING"
export COMMON STATE
grep -v -e '^\s*#' -e '^\s*$' "$QUEUE" | xargs -P "$JOBS" -I{} bash -c '
  set -f; line="$1"; name=$(echo "$line" | grep -o "run_name=[^ ]*" | cut -d= -f2)
  [ -e "$STATE/$name.done" ] && exit 0
  dir="$STATE/runs/$name"
  if [ -e "$dir/checkpoints/last.ckpt" ]; then args="resume=$dir trainer.num_threads=1 trainer.progress_bar=false"
  else rm -rf "$dir"; args="$COMMON $line output_dir=$dir"; fi
  if python -m phasefix.fit $args >> "$STATE/$name.log" 2>&1; then touch "$STATE/$name.done";
  else echo "failed: $line (log: $STATE/$name.log)"; fi' _ {}
