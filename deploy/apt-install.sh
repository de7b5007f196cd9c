#!/bin/sh
# Install the Debian packages named as arguments that the image does not have yet, then drop apt's lists.
# A base image that already carries them (an offline build's debootstrapped base) needs no mirror at all.
set -eu
missing=""
for package in "$@"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing="$missing $package"
done
if [ -n "$missing" ]; then
  apt-get update
  # shellcheck disable=SC2086 # one word per package
  apt-get install -y --no-install-recommends $missing
  rm -rf /var/lib/apt/lists/*
fi
