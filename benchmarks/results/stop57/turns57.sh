#!/bin/bash
# Stop 57, before and after in turns: ../host_turns.sh, with a git worktree of cbe19af (stop 56's
# last commit) at /tmp/old; the new side ran f6ebaa8.
exec bash "$(dirname "$0")/../host_turns.sh" 57
