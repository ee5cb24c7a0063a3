#!/bin/sh
# Builds dist/calc.pyz: byte-compiles the sources (so syntax errors fail the build), then
# packs them into an executable zipapp.
set -eu
cd "$(dirname "$0")"
rm -rf dist build
mkdir -p dist build
cp -r src/calc build/
python3 -m compileall -q build
python3 -m zipapp build -o dist/calc.pyz -m "calc.main:run"
echo "built dist/calc.pyz"
