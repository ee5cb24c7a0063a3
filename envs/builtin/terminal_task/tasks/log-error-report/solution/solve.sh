#!/bin/bash
set -euo pipefail
awk '$2 == "ERROR" { gsub(/[\[\]]/, "", $3); n[$3]++ } END { for (s in n) print s, n[s] }' \
  /app/logs/app.log | sort -k2,2nr -k1,1 > /app/report.txt
