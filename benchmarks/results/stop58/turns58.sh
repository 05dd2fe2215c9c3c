#!/bin/bash
# Stop 58, before and after in turns: ../host_turns.sh, with a git worktree of 24d37ee (stop 57's
# last commit) at /tmp/old.
exec bash "$(dirname "$0")/../host_turns.sh" 58
