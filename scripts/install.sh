#!/bin/sh
# Install (or upgrade) sglang-supervisor from this checkout on a systemd host, without a package:
#   /opt/venvs/sglang-supervisor        the supervisor in its own virtualenv (SGLang stays in yours)
#   /usr/local/lib/systemd/system       sglang-supervisor@.service, sglang-qwen.service
#   /usr/local/sbin/sglang-model        gives a configuration its own sglang-NAME.service
#   /usr/local/bin/sglang-supervisor    the command line
#   /usr/local/share/sglang-supervisor/examples   example configurations (replaced on upgrade)
#   /etc/sglang-supervisor/qwen.yaml    created from the example when missing; never overwritten
#   user and group `sglang`             the services run as it
# Idempotent: run it again to upgrade. Does not start anything.
#
# Usage: sudo scripts/install.sh [--add-model NAME [--from FILE]]
#   --add-model NAME   also render sglang-NAME.service for /etc/sglang-supervisor/NAME.yaml
#   --from FILE        with --add-model: copy FILE to NAME.yaml first when it does not exist
# Environment: PYTHON (default /usr/bin/python3, >= 3.10: the venv's interpreter must be one the
# unit can run, so not under /home, /root or /run/user, which ProtectHome=yes hides, and readable by
# the user sglang; a pyenv or conda python usually is not), SGLANG_SUPERVISOR_VENV (default
# /opt/venvs/sglang-supervisor; the units expect that path), PIP_* (pip's own settings).
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
EXAMPLES=/usr/local/share/sglang-supervisor/examples
VENV=${SGLANG_SUPERVISOR_VENV:-/opt/venvs/sglang-supervisor}
UNITS=/usr/local/lib/systemd/system
ETC=/etc/sglang-supervisor
model= from=

say() { echo "install.sh: $*" >&2; }
die() { echo "install.sh: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --add-model) [ $# -ge 2 ] || die "--add-model needs a NAME"; model=$2; shift 2 ;;
        --from) [ $# -ge 2 ] || die "--from needs a FILE"; from=$2; shift 2 ;;
        -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
[ -z "$from" ] || [ -n "$model" ] || die "--from needs --add-model NAME"
[ "$(id -u)" = 0 ] || die "run as root (it creates a user, /opt, /etc and unit files)"
if dpkg-query -W -f='${Status}' sglang-supervisor 2>/dev/null | grep -q 'ok installed'; then
    die "the sglang-supervisor Debian package is installed; upgrade the package instead (or remove it first)"
fi
command -v "$PY" >/dev/null 2>&1 || die "$PY not found; install Python >= 3.10 (Debian: apt-get install python3 python3-venv)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$("$PY" -V 2>&1) is too old: Python >= 3.10 is needed (set PYTHON=)"
ls "$src"/etc/sglang-supervisor/*.yaml >/dev/null 2>&1 || die "no example configuration in $src/etc/sglang-supervisor"

# 1. the user (the interpreter check below runs as it)
if ! getent passwd sglang >/dev/null; then
    say "creating system user sglang"
    useradd --system --user-group --home-dir /var/lib/sglang-supervisor --no-create-home \
        --shell /usr/sbin/nologin --comment "SGLang supervisor" sglang
fi
if getent group video >/dev/null && ! id -nG sglang | grep -qw video; then
    usermod -a -G video sglang  # NVIDIA device nodes are root:video 0660 on tightened hosts
fi

# 2. the interpreter: a venv's bin/python is a link to it, so the unit (User=sglang, ProtectHome=yes)
# must be able to run it; otherwise the unit fails with 203/EXEC while check/doctor pass as root.
fix="use the system interpreter (the default: PYTHON=/usr/bin/python3; Debian: apt-get install python3 python3-venv)"
# the path as given (a venv records it) and where it resolves to; the standard library's prefix
real=$("$PY" -c 'import os, sys; print(os.path.realpath(sys.executable)); print(sys.executable); print(os.path.realpath(sys.base_prefix))') \
    || die "cannot run $PY; $fix"
for p in $real; do
    case $p/ in
        /home/* | /root/* | /run/user/*)
            die "$PY is $p: the unit cannot run it (ProtectHome=yes hides /home, /root and /run/user); $fix" ;;
    esac
done
runuser -u sglang -- "$PY" -c '' 2>/dev/null \
    || die "$PY cannot be run by the user sglang (a directory on its path is private?); $fix"

# 3. the virtualenv (recreated when its interpreter is gone or is not the chosen one)
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null \
    || [ "$("$VENV/bin/python" -c 'import os, sys; print(os.path.realpath(sys._base_executable))' 2>/dev/null)" != "$(echo "$real" | head -n1)" ]; then
    say "creating $VENV with $PY"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PY" -m venv "$VENV" || die "'$PY -m venv' failed (Debian: apt-get install python3-venv)"
fi
say "installing the supervisor into $VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade "$src" \
    || die "pip install failed (network? see the pip output above)"

# 4. configuration: the examples are replaced; the operator's files in $ETC are never overwritten
install -d "$EXAMPLES"
install -m 0644 "$src"/etc/sglang-supervisor/*.yaml "$EXAMPLES/"
mkdir -p "$ETC"
if [ ! -e "$ETC/qwen.yaml" ]; then
    install -m 0640 -g sglang "$EXAMPLES/qwen.yaml" "$ETC/qwen.yaml"
    say "installed $ETC/qwen.yaml (from $EXAMPLES)"
fi
# earlier versions copied the demo (the simulator's file, not a deployment) to $ETC
if [ -f "$ETC/demo.yaml" ] && cmp -s "$EXAMPLES/demo.yaml" "$ETC/demo.yaml"; then
    rm -f "$ETC/demo.yaml"
fi

# 5. units, tools
install -d "$UNITS"
install -m 0644 "$src/units/sglang-supervisor@.service" "$src/units/sglang-qwen.service" "$UNITS/"
install -D -m 0755 "$src/units/sglang-model" /usr/local/sbin/sglang-model
ln -sfn "$VENV/bin/sglang-supervisor" /usr/local/bin/sglang-supervisor
ln -sfn "$VENV/bin/sglang-sim" /usr/local/bin/sglang-sim
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
else
    say "systemd is not running here: units installed, no daemon-reload"
fi
SGLANG_MODEL_NO_RELOAD=0 /usr/local/sbin/sglang-model refresh
[ -z "$model" ] || SGLANG_MODEL_SUPERVISOR="$VENV/bin/sglang-supervisor" /usr/local/sbin/sglang-model add "$model" ${from:+--from "$from"}

say "done. Next: edit $ETC/qwen.yaml (engine.command, engine.model_path), then"
say "  sglang-supervisor check --config $ETC/qwen.yaml && systemctl start sglang-qwen"
