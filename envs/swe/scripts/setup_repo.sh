#!/bin/sh
# Build a task repository: snapshot + source patch, hidden paths removed, ONE commit.
# Usage: setup_repo.sh REPO_DIR SRC_DIR   (SRC_DIR holds source.tar.gz, source.patch,
# remove.txt, message.txt). The identity and date are fixed, so the commit id depends only
# on the files: the same inputs give the same base_commit on every machine.
set -eu
repo="$1"
src="$2"
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0
export GIT_AUTHOR_NAME=envhub GIT_AUTHOR_EMAIL=envhub@localhost
export GIT_COMMITTER_NAME=envhub GIT_COMMITTER_EMAIL=envhub@localhost
export GIT_AUTHOR_DATE="2000-01-01T00:00:00+0000" GIT_COMMITTER_DATE="2000-01-01T00:00:00+0000"
rm -rf "$repo"
mkdir -p "$repo"
cd "$repo"
tar -xzf "$src/source.tar.gz" --no-same-owner --no-same-permissions
git -c init.defaultBranch=main init -q
if [ -s "$src/source.patch" ]; then
  git apply --whitespace=nowarn "$src/source.patch"
fi
while IFS= read -r path; do
  if [ -n "$path" ]; then rm -rf -- "./$path"; fi
done < "$src/remove.txt"
git add -A
git commit -q --no-verify -m "$(cat "$src/message.txt")"
git rev-parse HEAD
