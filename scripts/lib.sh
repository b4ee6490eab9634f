# Shared by the scripts: installs Debian packages non-interactively.
#   install_packages PACKAGE...          apt-get install them
#   need_packages PROBE:PACKAGE...       install each PACKAGE whose PROBE (a command name,
#                                        or an absolute path) is missing

install_packages() {
    local sudo=()
    ((EUID == 0)) || sudo=(sudo)
    echo "installing: $*" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq </dev/null
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" </dev/null
}

need_packages() {
    local missing=() pair probe
    for pair in "$@"; do
        probe=${pair%%:*}
        if [[ $probe == /* ]]; then
            [[ -e $probe ]] && continue
        else
            command -v "$probe" >/dev/null 2>&1 && continue
        fi
        missing+=("${pair#*:}")
    done
    ((${#missing[@]} == 0)) || install_packages "${missing[@]}"
}
