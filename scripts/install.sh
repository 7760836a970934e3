#!/bin/sh
# Install (or upgrade) sglang-supervisor from this checkout on a systemd host, without a package:
#   /opt/venvs/sglang-supervisor        the supervisor in its own virtualenv (SGLang stays in yours)
#   /usr/local/lib/systemd/system       sglang-supervisor@.service, sglang-qwen.service
#   /usr/local/sbin/sglang-model        gives a configuration its own sglang-NAME.service
#   /usr/local/bin/sglang-supervisor    the command line
#   /etc/sglang-supervisor/*.yaml       example configurations; edited files are never overwritten
#                                       (a newer example is written beside them as NAME.yaml.dist)
#   user and group `sglang`             the services run as it
# Idempotent: run it again to upgrade. Does not start anything.
#
# Usage: sudo scripts/install.sh [--add-model NAME [--from FILE]]
#   --add-model NAME   also render sglang-NAME.service for /etc/sglang-supervisor/NAME.yaml
#   --from FILE        with --add-model: copy FILE to NAME.yaml first when it does not exist
# Environment: PYTHON (default python3, >= 3.10), SGLANG_SUPERVISOR_VENV (default
# /opt/venvs/sglang-supervisor; the units expect that path), PIP_* (pip's own settings).
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
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

# 1. the virtualenv (recreated when its interpreter is gone, e.g. after a distribution upgrade)
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    say "creating $VENV"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PY" -m venv "$VENV" || die "'$PY -m venv' failed (Debian: apt-get install python3-venv)"
fi
say "installing the supervisor into $VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade "$src" \
    || die "pip install failed (network? see the pip output above)"

# 2. the user
if ! getent passwd sglang >/dev/null; then
    say "creating system user sglang"
    useradd --system --user-group --home-dir /var/lib/sglang-supervisor --no-create-home \
        --shell /usr/sbin/nologin --comment "SGLang supervisor" sglang
fi
if getent group video >/dev/null && ! id -nG sglang | grep -qw video; then
    usermod -a -G video sglang  # NVIDIA device nodes are root:video 0660 on tightened hosts
fi

# 3. configuration: never overwrite an operator's file
mkdir -p "$ETC"
for f in "$src"/etc/sglang-supervisor/*.yaml; do
    name=$(basename "$f")
    if [ ! -e "$ETC/$name" ]; then
        install -m 0644 "$f" "$ETC/$name"
        say "installed $ETC/$name"
    elif ! cmp -s "$f" "$ETC/$name"; then
        install -m 0644 "$f" "$ETC/$name.dist"
        say "kept your $ETC/$name; the shipped version is $ETC/$name.dist"
    fi
done

# 4. units, tools
install -d "$UNITS"
install -m 0644 "$src/units/sglang-supervisor@.service" "$src/units/sglang-qwen.service" "$UNITS/"
install -D -m 0755 "$src/units/sglang-model" /usr/local/sbin/sglang-model
ln -sfn "$VENV/bin/sglang-supervisor" /usr/local/bin/sglang-supervisor
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
else
    say "systemd is not running here: units installed, no daemon-reload"
fi
SGLANG_MODEL_NO_RELOAD=0 /usr/local/sbin/sglang-model refresh
[ -z "$model" ] || /usr/local/sbin/sglang-model add "$model" ${from:+--from "$from"}

say "done. Next: edit $ETC/qwen.yaml (engine.command, engine.model_path), then"
say "  sglang-supervisor check --config $ETC/qwen.yaml && systemctl start sglang-qwen"
