#!/bin/bash
# Stop 56, before and after in turns: ../sync_turns.sh, three jobs each, the numpy all-reduce at
# 4 and 2 ranks, with a git worktree of 4452f3e at /tmp/old.
exec bash "$(dirname "$0")/../sync_turns.sh" 56 3 4,2 small
