#!/bin/bash
awk '$2 == "ERROR"' /app/logs/service.log | wc -l > /app/answer.txt
