#!/usr/bin/env bash
# Installs redis-server and redis-cli (Debian's redis-server 7.0) when they
# are missing: the tier tests start real servers on loopback ports. .ci/run
# runs this before make test, and `make redis` runs it on demand; make test
# itself never calls apt-get. Idempotent.
set -euo pipefail
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then exit 0; fi
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then sudo=sudo; else sudo=; fi
for try in 1 2 3; do
	if $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; then break; fi
	[ "$try" = 3 ] && { echo "redis.sh: apt-get install redis-server failed" >&2; exit 1; }
	sleep 5
done
# The package may start a system server on 6379; the tests never use it.
command -v redis-server >/dev/null && echo "redis.sh: $(redis-server --version)"
