#!/bin/bash
set -euo pipefail
cd /app/data
find . -type f -size +1048576c -printf '%s\t%P\n' | sort -t$'\t' -k1,1nr -k2,2 | cut -f2 > /app/large.txt
