#!/bin/bash
set -euo pipefail
cd /app/repo
commit=$(git rev-list -n 1 HEAD -- limits.conf)
git show "$commit^:limits.conf" > limits.conf
