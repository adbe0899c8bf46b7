#!/usr/bin/env bash
# Runs a launcher command (`deepspeed ...`) so that Ctrl-C stops the run without a traceback from
# the launcher itself: usage `bash scripts/run_launcher.sh deepspeed [launcher flags] deepspeed_train.py ...`.
#
# Ctrl-C sends SIGINT to every process of the terminal's job. DeepSpeed's single-node runner (the
# `deepspeed` command) has no handler for it and dies in a KeyboardInterrupt traceback, while its
# launch.py stops the ranks and each rank writes its stop checkpoint. Started with SIGINT ignored
# (inherited across exec), the runner waits for launch.py instead and exits with its code; launch.py
# and the ranks install their own handlers, so they still see Ctrl-C. SIGTERM is unchanged.
trap '' INT
exec "$@"
