# Shared setup for the scripts in scripts/: installs what Asterism needs on a fresh Debian
# machine when it is missing. Sourced, not executed.

# Debian packages: the TPM emulator and tools (tests and local clusters), the TSS2
# libraries the `asterism-tpm` crate links, cryptsetup for LUKS2 state disks (the program,
# and the library the `asterism-cryptsetup` crate links), and curl (a test that reaches the
# join service's admin socket as another user).
SYSTEM_PACKAGES=(swtpm swtpm-tools tpm2-tools libtss2-dev cryptsetup-bin libcryptsetup-dev pkg-config curl)

# Steps are timed. `step NAME` ends the step before it (printing its wall time) and starts
# the next; `step_end` ends the last one. When STEP_LOG names a file, every step of this
# script and of the scripts it runs appends "SECONDS<TAB>NAME" to it, and `step_table`
# prints them all at the end (scripts/test), so a slow step is seen at once.
# Besides the wall time, a step's CPU time (user + system of the commands it ran and waited
# for) is kept: on a shared, busy machine the wall time grows, the CPU time much less.
_step_name=""
_step_start=0
_step_cpu=0
# CPU seconds used so far by this shell's finished children (cutime + cstime of
# /proc/PID/stat, in clock ticks; `times` would run in a subshell here and see none).
_clock_ticks=$(getconf CLK_TCK 2>/dev/null || echo 100)
_children_cpu() {
    local stat
    read -r stat </proc/$$/stat
    # Fields after the command name, which is in parentheses: state is field 3.
    set -- ${stat##*) }
    echo $(((${14} + ${15}) / _clock_ticks))
}
step_end() {
    # A subshell inherits the step but must not end it (it would be counted once per subshell).
    if [ -n "$_step_name" ] && [ "$BASHPID" = "$$" ]; then
        local took=$(($(date +%s) - _step_start)) cpu=$(($(_children_cpu) - _step_cpu))
        printf '    (%s: %dm%02ds, cpu %dm%02ds)\n' "$_step_name" $((took / 60)) $((took % 60)) \
            $((cpu / 60)) $((cpu % 60)) >&2
        if [ -n "${STEP_LOG:-}" ]; then
            printf '%d\t%d\t%s\n' "$took" "$cpu" "$_step_name" >>"$STEP_LOG"
        fi
    fi
    _step_name=""
}
step() {
    step_end
    # STEP_PREFIX marks the steps of a script that runs beside others ("[background] ").
    _step_name=${STEP_PREFIX:-}$*
    _step_start=$(date +%s)
    _step_cpu=$(_children_cpu)
    printf '\n==> %s\n' "$*" >&2
}
# A step that is a message, not work: printed, not timed.
note() { step_end; printf '\n==> %s\n' "$*" >&2; }

# Prints the steps recorded in STEP_LOG as a table in the order they ran, with the total wall
# time since TOTAL_START (seconds since the epoch) and the CPU time of all steps.
step_table() {
    local total_start=$1 status=$2
    [ -n "${STEP_LOG:-}" ] && [ -f "$STEP_LOG" ] || return 0
    local total=$(($(date +%s) - total_start))
    {
        printf '\n==> time per step (%s; [background] steps ran beside the others)\n' \
            "$([ "$status" = 0 ] && echo passed || echo "FAILED, exit $status")"
        printf '%9s %9s  %s\n' "wall" "cpu" "step"
        local secs cpu name cpu_total=0
        while IFS=$'\t' read -r secs cpu name; do
            printf '%5dm%02ds %5dm%02ds  %s\n' $((secs / 60)) $((secs % 60)) $((cpu / 60)) $((cpu % 60)) "$name"
        done <"$STEP_LOG"
        # The whole run's CPU time, read once: a background build's time is in its own steps,
        # and again in the foreground step during which it was reaped, so do not add them up.
        cpu_total=$(_children_cpu)
        printf '%5dm%02ds %5dm%02ds  %s\n' $((total / 60)) $((total % 60)) $((cpu_total / 60)) $((cpu_total % 60)) \
            "total (load average at the end: $(cut -d' ' -f1-3 /proc/loadavg))"
    } >&2
}

install_system_packages() {
    local missing=()
    for pkg in "${SYSTEM_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        return
    fi
    step "installing Debian packages: ${missing[*]}"
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

install_rust_components() {
    if ! command -v cargo >/dev/null 2>&1; then
        echo "cargo not found: install Rust with rustup (https://rustup.rs) first" >&2
        exit 1
    fi
    # rust-toolchain.toml pins the toolchain; make sure its components are present.
    if command -v rustup >/dev/null 2>&1; then
        rustup component add rustfmt clippy >/dev/null
    fi
}

# Installs a cargo subcommand (`cargo-fuzz`, `cargo-deny`, `cargo-mutants`) from crates.io
# when it is missing, at the version given (the one the scripts were written against).
install_cargo_tool() {
    local name=$1 version=$2
    # Cargo finds subcommands in $CARGO_HOME/bin even when it is not on PATH (a fresh,
    # temporary CARGO_HOME: scripts/fresh-check), so look there too.
    if command -v "$name" >/dev/null 2>&1 || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/$name" ]; then
        return
    fi
    step "installing $name $version (cargo install --locked)"
    cargo install --locked "$name@$version"
}

# Installs QEMU and OVMF for VM mode when they are missing; true when both are usable. A
# machine whose package sources lack them gets false, not a failure: callers say SKIPPED.
vm_host_ready() {
    local pkg missing=()
    for pkg in qemu-system-x86 ovmf; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        step "installing Debian packages: ${missing[*]}"
        local sudo=()
        if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
        "${sudo[@]}" apt-get update -qq || true
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" || true
    fi
    command -v qemu-system-x86_64 >/dev/null 2>&1 && [ -e /usr/share/OVMF/OVMF_CODE_4M.fd ]
}

# The last step's time is printed when the script exits; a script that sets its own EXIT
# trap calls step_end in it.
trap step_end EXIT
