#!/bin/sh
# Remove what scripts/install.sh installed. Idempotent.
#   sudo scripts/uninstall.sh          stop the services, remove units, tools and the virtualenv;
#                                      keep /etc/sglang-supervisor, state, logs, caches and the user
#   sudo scripts/uninstall.sh --purge  also remove those
set -eu
VENV=${SGLANG_SUPERVISOR_VENV:-/opt/venvs/sglang-supervisor}
UNITS=/usr/local/lib/systemd/system
purge=0
case ${1:-} in
    --purge) purge=1 ;;
    "") ;;
    -h | --help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "uninstall.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "uninstall.sh: run as root" >&2; exit 1; }
if dpkg-query -W -f='${Status}' sglang-supervisor 2>/dev/null | grep -q 'ok installed'; then
    echo "uninstall.sh: the Debian package is installed: use apt-get remove/purge sglang-supervisor" >&2
    exit 1
fi

# units made by sglang-model (marker line) and the shipped ones
rendered=$(grep -l '^# rendered-by: sglang-model' /etc/systemd/system/sglang-*.service 2>/dev/null || true)
if [ -d /run/systemd/system ]; then
    running=$(systemctl list-units --plain --no-legend --all 'sglang-*.service' 'sglang-supervisor@*.service' 2>/dev/null \
        | awk '{print $1}')
    for u in $running; do
        systemctl disable --now "$u" >/dev/null 2>&1 || systemctl stop "$u" || true
    done
fi
rm -f "$UNITS/sglang-supervisor@.service" "$UNITS/sglang-qwen.service" \
    /usr/local/sbin/sglang-model /usr/local/bin/sglang-supervisor /usr/local/bin/sglang-sim
rm -rf /usr/local/share/sglang-supervisor
for f in $rendered; do
    rm -f "$f" "/etc/systemd/system/multi-user.target.wants/${f##*/}"
done
rm -rf "$VENV"
rmdir "$(dirname "$VENV")" 2>/dev/null || true
if [ $purge = 1 ]; then
    rm -rf /etc/sglang-supervisor /var/lib/sglang-supervisor /var/log/sglang-supervisor \
        /var/cache/sglang-supervisor
    if getent passwd sglang >/dev/null; then userdel sglang 2>/dev/null || true; fi
    if getent group sglang >/dev/null; then groupdel sglang 2>/dev/null || true; fi
fi
[ -d /run/systemd/system ] && systemctl daemon-reload || true
if [ $purge = 1 ]; then
    echo "uninstall.sh: removed, with configuration, state, logs, caches and the user" >&2
else
    echo "uninstall.sh: removed; kept /etc/sglang-supervisor, /var/lib|log|cache/sglang-supervisor and the user" >&2
fi
