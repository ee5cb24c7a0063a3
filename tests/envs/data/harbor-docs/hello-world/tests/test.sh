#!/bin/bash
# Runs from the task's working directory; the verdict goes to /logs/verifier/reward.txt.
if python3 -m pytest /tests/test_outputs.py -rA; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
