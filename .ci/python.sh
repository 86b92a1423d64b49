#!/usr/bin/env bash
# Installs Debian's Python packages the Python package's tests and wheel
# need (numpy, pytest, torch CPU, setuptools, wheel, venv, pip, and
# python3-dev: the headers make python compiles the _fast extension with)
# when any is missing: make test-python runs the tests with
# /usr/bin/python3. Idempotent.
set -euo pipefail
py=/usr/bin/python3
if [ -x "$py" ] && "$py" -c 'import numpy, pytest, torch, setuptools, wheel, venv, pip, os, sysconfig
assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null; then exit 0; fi
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then sudo=sudo; else sudo=; fi
pkgs="python3 python3-dev python3-numpy python3-pytest python3-torch python3-setuptools python3-wheel python3-venv python3-pip"
for try in 1 2 3; do
	if $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null; then break; fi
	[ "$try" = 3 ] && { echo "python.sh: apt-get install $pkgs failed" >&2; exit 1; }
	sleep 5
done
"$py" -c 'import numpy, torch; print("python.sh: numpy", numpy.__version__, "torch", torch.__version__)'
