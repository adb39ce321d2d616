# shellcheck shell=bash
# Shared by bin/test and bin/demo (sourced, not executed): the local chain's tools (issue 18).
#
#   chain_tools_ensure ROOT   install anvil (npm @foundry-rs/anvil) and solc (npm solc, solcjs)
#                             at the pinned versions into ROOT/.cache/chain (gitignored), once,
#                             then export AGENTPAY_ANVIL_BIN and AGENTPAY_SOLC_JS.
#
# Never fatal: when node/npm are missing or the install fails it says why, loudly, and exports
# AGENTPAY_CHAIN_UNAVAILABLE with the reason; the tests then fall back to eth-tester (and say so).

AGENTPAY_ANVIL_VERSION="1.7.1"
AGENTPAY_SOLC_VERSION="0.8.30"

_chain_warn() {
    echo "" >&2
    echo "!!! bin/_chain.sh: $1" >&2
    echo "!!! the on-chain tests fall back to eth-tester (in-process py-evm); anvil-only tests skip, naming why" >&2
    echo "" >&2
    export AGENTPAY_CHAIN_UNAVAILABLE="$1"
}

# The platform package @foundry-rs/anvil depends on (it ships the binary; the wrapper's
# postinstall only checks it, so installs run with --ignore-scripts).
_chain_anvil_platform() {
    local os arch
    case "$(uname -s)" in
        Linux) os=linux ;;
        Darwin) os=darwin ;;
        *) return 1 ;;
    esac
    case "$(uname -m)" in
        x86_64 | amd64) arch=amd64 ;;
        aarch64 | arm64) arch=arm64 ;;
        *) return 1 ;;
    esac
    echo "$os-$arch"
}

chain_tools_ensure() {
    local root="$1"
    local cache="$root/.cache/chain"
    local stamp="$cache/.installed-anvil-$AGENTPAY_ANVIL_VERSION-solc-$AGENTPAY_SOLC_VERSION"
    local platform anvil solc

    unset AGENTPAY_CHAIN_UNAVAILABLE
    if ! platform="$(_chain_anvil_platform)"; then
        _chain_warn "no anvil build for $(uname -s)/$(uname -m)"
        return 0
    fi
    anvil="$cache/node_modules/@foundry-rs/anvil-$platform/bin/anvil"
    solc="$cache/node_modules/solc/solc.js"

    if [ ! -e "$stamp" ] || [ ! -x "$anvil" ] || [ ! -f "$solc" ]; then
        if ! command -v npm >/dev/null 2>&1; then
            _chain_warn "npm is not installed, so anvil@$AGENTPAY_ANVIL_VERSION cannot be installed"
            return 0
        fi
        echo "==> installing anvil $AGENTPAY_ANVIL_VERSION and solc $AGENTPAY_SOLC_VERSION from npm into $cache"
        mkdir -p "$cache"
        [ -f "$cache/package.json" ] || echo '{"name": "agentpay-chain-tools", "private": true}' >"$cache/package.json"
        rm -f "$cache"/.installed-*
        if ! npm install --prefix "$cache" --ignore-scripts --no-audit --no-fund --loglevel=error \
            --save-exact "@foundry-rs/anvil@$AGENTPAY_ANVIL_VERSION" "solc@$AGENTPAY_SOLC_VERSION" >&2; then
            _chain_warn "npm install of @foundry-rs/anvil@$AGENTPAY_ANVIL_VERSION / solc@$AGENTPAY_SOLC_VERSION failed (offline?)"
            return 0
        fi
        touch "$stamp"
    fi
    if ! "$anvil" --version >/dev/null 2>&1; then
        _chain_warn "$anvil does not run on this machine"
        return 0
    fi
    export AGENTPAY_ANVIL_BIN="$anvil"
    if command -v node >/dev/null 2>&1 && [ -f "$solc" ]; then
        export AGENTPAY_SOLC_JS="$solc"
    else
        echo "bin/_chain.sh: node or solcjs is missing; the artifact rebuild test will say so" >&2
    fi
    echo "==> chain: $("$anvil" --version | head -n 1), solc $AGENTPAY_SOLC_VERSION (solcjs) from $cache"
}
