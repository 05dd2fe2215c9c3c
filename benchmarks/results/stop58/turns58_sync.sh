#!/bin/bash
# Stop 58, the synchronous paths this stop did not change, before and after in turns:
# ../sync_turns.sh, two jobs each, the numpy all-reduce at 4 ranks, with a git worktree of
# 24d37ee at /tmp/old.
exec bash "$(dirname "$0")/../sync_turns.sh" 58 2 4 small4
