"""The ``systemctl``, ``journalctl`` and ``docker`` lines that read or change nothing, answered in sh.

SIMULATION ONLY. Every simulated tool call used to start a Python interpreter; the
exporter's scrape (earlyoom's unit, the engine unit, earlyoom's kills) and ``up``'s
readiness checks ask these on every round. The wrappers procshims writes put these
functions first; each either answers and exits, or returns, and the wrapper then runs the
Python shim (sparkctl_sim.systemctlshim, sparkctl_sim.journalshim), which is the
reference: tests/sim/test_shim_views.py runs both on the same records and compares them.

* ``systemctl show -p P1,P2 UNIT`` (the one ``-p`` form sparkctl uses) for the properties
  that follow from the unit's runtime record and the unit files alone (Id, Names,
  LoadState, ActiveState, SubState, MainPID, ExecMainPID, Result, NRestarts, and
  UnitFileState: "enabled" and "not-found" from the files, "disabled" and "static" from the
  [Install] lines of the daemon-reload's copy), and ``systemctl is-active [-q] UNIT``.
  The record is the JSON ``Units.save_state`` writes (shimbase._write_json_atomic: indent 1,
  sorted keys, so each top-level key is a line of its own); a value that is not a plain word
  or number sends the call to Python. The supervisor check is ``Units.state``'s: an active
  unit whose supervisor and main process are both gone (SIGKILL, a power cut) is failed
  (Result=signal), a process being alive judged as shimbase._proc_start_ticks does it
  (``/proc/PID/stat``: not a zombie, the start time recorded).
* ``systemctl enable UNIT`` whose links all exist, ``systemctl disable UNIT`` with none, and
  ``systemctl stop UNIT`` of a loaded unit recorded inactive or failed: the Python shim does
  nothing then, and neither does sh (``up`` asks these of every node on every run).
* ``systemctl daemon-reload``: systemdunits.Units.daemon_reload's copy in sh (the loaded copies
  removed, every plain ``*.service`` file of the unit directory copied in), when the loaded
  directory exists and neither holds a dot file (Python's glob sees those, sh's does not).
* ``docker rm [-f|--force] NAME`` on a node whose store holds no container: docker's "No such
  container" and exit 1, as dockerps.docker_rm answers then (the unit's ``ExecStartPre=-docker rm
  -f`` and the stale stop ask it on every ``up``).
* ``journalctl [-b] -u UNIT [-o cat|short] [--no-pager] [-q]``: the unit's journal file,
  ``-o cat`` dropping the ``TS systemd[1]: NAME: `` prefix of systemd's own lines
  (journalshim's ``_SYSTEMD_LINE``).

Anything else (another verb or option, several units, a property outside that list, an
[Install] section sh does not read plainly) goes to Python.
"""

from __future__ import annotations

# ``exit`` when answered, ``return`` for Python. Positional parameters are the caller's "$@".
SYSTEMCTL_SH = r'''sc_alive() {
  case "$1" in ''|0|null|-*) return 1 ;; esac
  sc_w=$2; sc_st=
  [ -r "/proc/$1/stat" ] && read -r sc_st 2>/dev/null <"/proc/$1/stat"
  [ -n "$sc_st" ] || return 1
  sc_st=${sc_st##*) }
  # shellcheck disable=SC2086 # the fields of /proc/PID/stat after the command name, split
  set -- $sc_st
  [ "$1" = Z ] && return 1
  case "$sc_w" in ''|null) return 0 ;; esac
  [ "${20}" = "$sc_w" ]
}
sc_install() {
  # Not enabled: "disabled" if the loaded unit's [Install] names a target, else "static"
  # (systemctlshim._is_enabled); sc_ts: the link directories "T.wants"/"T.requires" (_enable).
  # Only for the daemon-reload's copy equal to the file on disk and [Install] lines of the
  # plain shapes; anything else (no copy yet, a changed file, a continuation, spaces around
  # "=", another key) is Python's.
  [ -f "$1" ] && cmp -s "$1" "$2" || return 1
  UnitFileState=static; sc_sec=; sc_ts=
  while IFS= read -r sc_l || [ -n "$sc_l" ]; do
    case "$sc_l" in
      *\\) return 1 ;;
      '['*']') sc_sec=$sc_l; continue ;;
    esac
    [ "$sc_sec" = '[Install]' ] || continue
    case "$sc_l" in
      ''|'#'*|';'*) ;;
      WantedBy=[A-Za-z0-9@_.-]*|RequiredBy=[A-Za-z0-9@_.-]*)
        case "${sc_l#*=}" in *[!A-Za-z0-9@_.\ -]*) return 1 ;; esac
        case "$sc_l" in WantedBy=*) sc_k=wants ;; *) sc_k=requires ;; esac
        for sc_t in ${sc_l#*=}; do sc_ts="$sc_ts $sc_t.$sc_k"; done
        UnitFileState=disabled ;;
      *) return 1 ;;
    esac
  done <"$1"
}
sc_noop() {
  # ``enable U`` whose links all exist, ``disable U`` with none, ``stop U`` of a loaded unit
  # whose record says inactive or failed: what the Python shim does then is nothing (no output,
  # exit 0; systemctlshim._enable, _disable, _stop). Anything else is Python's.
  [ -n "$SPARKCTL_SIM_RUN_DIR" ] && [ -n "$SPARKCTL_SIM_UNIT_DIR" ] && [ "$#" = 2 ] || return 0
  sc_u=$2
  case "$sc_u" in ''|-*|*/*) return 0 ;; *.*) ;; *) sc_u=$sc_u.service ;; esac
  sc_d="$SPARKCTL_SIM_RUN_DIR/systemd"
  case "$1" in
    disable)
      for sc_f in "$SPARKCTL_SIM_UNIT_DIR"/*.*/"$sc_u"; do [ -L "$sc_f" ] && return 0; done
      exit 0 ;;
    enable)
      sc_install "$sc_d/loaded/$sc_u" "$SPARKCTL_SIM_UNIT_DIR/$sc_u" || return 0
      [ -n "$sc_ts" ] || return 0
      for sc_t in $sc_ts; do [ -L "$SPARKCTL_SIM_UNIT_DIR/$sc_t/$sc_u" ] || return 0; done
      exit 0 ;;
    stop)
      [ -f "$sc_d/loaded/$sc_u" ] && cmp -s "$sc_d/loaded/$sc_u" "$SPARKCTL_SIM_UNIT_DIR/$sc_u" || return 0
      [ -r "$sc_d/$sc_u.json" ] || return 0
      sc_st=
      while IFS= read -r sc_l; do
        case "$sc_l" in ' "ActiveState": "inactive",'|' "ActiveState": "failed",') sc_st=1 ;; esac
      done <"$sc_d/$sc_u.json"
      [ -n "$sc_st" ] && exit 0 ;;
  esac
  return 0
}
sc_fast() {
  [ -n "$SPARKCTL_SIM_RUN_DIR" ] && [ -n "$SPARKCTL_SIM_UNIT_DIR" ] || return 0
  sc_q=
  case "$#:$1:$2" in
    4:show:-p) sc_p=$3; sc_u=$4 ;;
    2:is-active:*) sc_p=; sc_u=$2 ;;
    3:is-active:-q|3:is-active:--quiet) sc_p=; sc_u=$3; sc_q=1 ;;
    *) return 0 ;;
  esac
  case "$sc_u" in ''|-*|*/*) return 0 ;; *.*) ;; *) sc_u=$sc_u.service ;; esac
  if [ "$1" = show ]; then
    [ -n "$sc_p" ] || return 0
    sc_ifs=$IFS; IFS=,
    for sc_k in $sc_p; do
      case "$sc_k" in
        Id|Names|LoadState|UnitFileState|ActiveState|SubState|MainPID|ExecMainPID|Result|NRestarts) ;;
        *) IFS=$sc_ifs; return 0 ;;
      esac
    done
    IFS=$sc_ifs
  fi
  sc_d="$SPARKCTL_SIM_RUN_DIR/systemd"
  ActiveState=inactive; SubState=dead; MainPID=0; Result=success; NRestarts=0
  sc_ms=; sc_sp=; sc_ss=; sc_sup=; sc_in=
  if [ -r "$sc_d/$sc_u.json" ]; then
    while IFS= read -r sc_l; do
      case "$sc_l" in
        ' "supervisor": {') sc_sup=1; sc_in=1; continue ;;
        ' }'|' },') sc_in=; continue ;;
      esac
      sc_v=${sc_l#*\": }; sc_v=${sc_v%,}
      if [ -n "$sc_in" ]; then
        case "$sc_l" in '  "pid": '*) sc_sp=$sc_v ;; '  "start": '*) sc_ss=$sc_v ;; esac
        continue
      fi
      case "$sc_l" in
        ' "ActiveState": '*|' "SubState": '*|' "MainPID": '*|' "Result": '*|' "NRestarts": '*|' "main_start": '*) ;;
        *) continue ;;
      esac
      case "$sc_v" in
        \"*\\*|*\ *) return 0 ;;
        \"*\") sc_v=${sc_v#\"}; sc_v=${sc_v%\"} ;;
        null) case "$sc_l" in ' "MainPID": '*|' "main_start": '*) ;; *) return 0 ;; esac ;;
        *[!0-9]*) return 0 ;;
      esac
      case "$sc_l" in
        ' "ActiveState": '*) ActiveState=$sc_v ;;
        ' "SubState": '*) SubState=$sc_v ;;
        ' "MainPID": '*) MainPID=$sc_v ;;
        ' "Result": '*) Result=$sc_v ;;
        ' "NRestarts": '*) NRestarts=$sc_v ;;
        ' "main_start": '*) sc_ms=$sc_v ;;
      esac
    done <"$sc_d/$sc_u.json"
  fi
  [ "$MainPID" = null ] && MainPID=0
  case "$ActiveState" in
    active|activating|deactivating)
      if [ -n "$sc_sup" ] && ! sc_alive "$sc_sp" "$sc_ss" && ! sc_alive "$MainPID" "$sc_ms" \
          && [ "$ActiveState:$SubState" != active:exited ]; then
        ActiveState=failed; SubState=failed; MainPID=0; Result=signal
      fi ;;
  esac
  if [ "$1" = is-active ]; then
    [ -n "$sc_q" ] || printf '%s\n' "$ActiveState"
    [ "$ActiveState" = active ] && exit 0
    exit 3
  fi
  LoadState=not-found; UnitFileState=
  { [ -f "$SPARKCTL_SIM_UNIT_DIR/$sc_u" ] || [ -e "$sc_d/loaded/$sc_u" ]; } && LoadState=loaded
  case ",$sc_p," in
    *,UnitFileState,*)
      if [ "$LoadState" = loaded ]; then
        if [ -f "$SPARKCTL_SIM_UNIT_DIR/$sc_u" ]; then
          for sc_f in "$SPARKCTL_SIM_UNIT_DIR"/*.*/"$sc_u"; do [ -L "$sc_f" ] && UnitFileState=enabled; done
          [ -n "$UnitFileState" ] || sc_install "$sc_d/loaded/$sc_u" "$SPARKCTL_SIM_UNIT_DIR/$sc_u" || return 0
        else
          UnitFileState=not-found
        fi
      fi ;;
  esac
  IFS=,
  for sc_k in $sc_p; do
    case "$sc_k" in
      Id|Names) sc_v=$sc_u ;;
      LoadState) sc_v=$LoadState ;;
      UnitFileState) sc_v=$UnitFileState ;;
      ActiveState) sc_v=$ActiveState ;;
      SubState) sc_v=$SubState ;;
      MainPID|ExecMainPID) sc_v=$MainPID ;;
      Result) sc_v=$Result ;;
      NRestarts) sc_v=$NRestarts ;;
    esac
    printf '%s=%s\n' "$sc_k" "$sc_v"
  done
  exit 0
}
sc_reload() {
  [ "$#" = 1 ] && [ -n "$SPARKCTL_SIM_RUN_DIR" ] && [ -n "$SPARKCTL_SIM_UNIT_DIR" ] || return 0
  sc_l="$SPARKCTL_SIM_RUN_DIR/systemd/loaded"
  [ -d "$sc_l" ] && [ -d "$SPARKCTL_SIM_UNIT_DIR" ] || return 0
  for sc_f in "$sc_l"/.* "$SPARKCTL_SIM_UNIT_DIR"/.*.service; do
    case "${sc_f##*/}" in .|..|'.*'|'.*.service') ;; *) return 0 ;; esac
  done
  rm -f -- "$sc_l"/*
  for sc_f in "$SPARKCTL_SIM_UNIT_DIR"/*.service; do
    [ -f "$sc_f" ] && [ ! -L "$sc_f" ] && cp -- "$sc_f" "$sc_l/${sc_f##*/}"
  done
  exit 0
}
[ "$1" = daemon-reload ] && sc_reload "$@"
sc_noop "$@"
sc_fast "$@"
'''

DOCKER_SH = r'''dk_rm() {
  [ -n "$SPARKCTL_SIM_RUN_DIR" ] || return 0
  case "$#:$2" in
    3:-f|3:--force) dk_ref=$3 ;;
    2:*) dk_ref=$2 ;;
    *) return 0 ;;
  esac
  case "$dk_ref" in ''|-*) return 0 ;; esac
  for dk_f in "$SPARKCTL_SIM_RUN_DIR/docker/containers"/*.json; do [ -e "$dk_f" ] && return 0; done
  printf 'Error response from daemon: No such container: %s\n' "$dk_ref" >&2
  exit 1
}
[ "$1" = rm ] && dk_rm "$@"
'''

JOURNALCTL_SH = r'''# shellcheck disable=SC1003 # sed's `$a\`: end the last line with a newline, as journalshim does
jc_fast() {
  [ -n "$SPARKCTL_SIM_RUN_DIR" ] || return 0
  jc_u=; jc_cat=
  while [ "$#" -gt 0 ]; do
    case "$1" in
      -u|--unit) [ "$#" -ge 2 ] || return 0; jc_u=$2; shift ;;
      --unit=*) jc_u=${1#--unit=} ;;
      -o) [ "$#" -ge 2 ] || return 0
          case "$2" in cat) jc_cat=1 ;; short) jc_cat= ;; *) return 0 ;; esac; shift ;;
      -b|--no-pager|-q|--quiet) ;;
      *) return 0 ;;
    esac
    shift
  done
  case "$jc_u" in ''|*/*) return 0 ;; *.*) ;; *) jc_u=$jc_u.service ;; esac
  jc_f="$SPARKCTL_SIM_RUN_DIR/systemd/$jc_u.journal.log"
  [ -r "$jc_f" ] || exit 0
  if [ -n "$jc_cat" ]; then
    LC_ALL=C exec sed -e 's/^[^[:space:]][^[:space:]]* systemd\[1\]: [^:][^:]*: //' -e '$a\' "$jc_f"
  fi
  LC_ALL=C exec sed -e '$a\' "$jc_f"
}
jc_fast "$@"
'''
