#!/bin/bash
# Issue #38's host targets in one run (stop 56): the shared script, its files tagged 56.
# Argument: a suffix for the output files (one per run).
exec bash "$(dirname "$0")/../issue38_targets.sh" 56 "$@"
