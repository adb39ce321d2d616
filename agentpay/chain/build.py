"""Build the token contract reproducibly: `python -m agentpay.chain.build` (or `--check`).

solc comes from npm (solcjs, the exact version bin/_chain.sh pins) and runs through node with
fixed standard-JSON settings, so the same source always gives the same bytes; the artifact in
`artifacts/` is committed and a test rebuilds it and compares byte for byte. The product never
compiles at run time: it only reads the committed artifact.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONTRACTS = HERE / "contracts"
ARTIFACTS = HERE / "artifacts"
ROOT = HERE.parent.parent
CONTRACT = "EIP3009Token"
# Keep in step with AGENTPAY_SOLC_VERSION in bin/_chain.sh and the source's pragma.
SOLC_VERSION = "0.8.30"
DEFAULT_SOLC_JS = ROOT / ".cache" / "chain" / "node_modules" / "solc" / "solc.js"

SETTINGS = {
    "optimizer": {"enabled": True, "runs": 200},
    # cancun: what both anvil and eth-tester's py-evm execute (PUSH0, MCOPY).
    "evmVersion": "cancun",
    # No metadata hash in the bytecode: the bytes depend on the source and settings only.
    "metadata": {"bytecodeHash": "none"},
    "outputSelection": {"*": {"*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"]}},
}

_NODE_COMPILE = (
    # require() the package (index.js), not solc.js: that is the CLI and would run.
    "const solc = require(process.argv[1]);"
    "const input = require('fs').readFileSync(0, 'utf8');"
    "process.stdout.write(JSON.stringify({version: solc.version(), output: JSON.parse(solc.compile(input))}));"
)


class BuildError(RuntimeError):
    pass


def solc_js_path() -> Path:
    path = Path(os.environ.get("AGENTPAY_SOLC_JS") or DEFAULT_SOLC_JS)
    if not path.is_file():
        raise BuildError(f"solcjs not found at {path}: run `. bin/_chain.sh && chain_tools_ensure .` "
                         f"(installs solc@{SOLC_VERSION} from npm) or set AGENTPAY_SOLC_JS")
    if shutil.which("node") is None:
        raise BuildError("node is not installed; solcjs needs it")
    return path


def source_path() -> Path:
    return CONTRACTS / f"{CONTRACT}.sol"


def build() -> str:
    """Compile the source and return the artifact's exact text."""
    source = source_path().read_text()
    request = {"language": "Solidity", "sources": {f"{CONTRACT}.sol": {"content": source}}, "settings": SETTINGS}
    proc = subprocess.run(["node", "-e", _NODE_COMPILE, str(solc_js_path().parent)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise BuildError(f"solcjs failed: {proc.stderr.strip()[:2000]}")
    answer = json.loads(proc.stdout)
    version = answer["version"]
    if not version.startswith(SOLC_VERSION + "+"):
        raise BuildError(f"solcjs is {version}, the build pins {SOLC_VERSION}")
    output = answer["output"]
    errors = [e for e in output.get("errors", []) if e.get("severity") == "error"]
    if errors:
        raise BuildError("\n".join(e.get("formattedMessage", e.get("message", "")) for e in errors))
    compiled = output["contracts"][f"{CONTRACT}.sol"][CONTRACT]
    artifact = {
        "contractName": CONTRACT,
        "sourcePath": f"agentpay/chain/contracts/{CONTRACT}.sol",
        "sourceSha256": hashlib.sha256(source.encode()).hexdigest(),
        "compiler": {"name": "solc", "distribution": "npm solc (solcjs)", "version": version, "settings": SETTINGS},
        "abi": compiled["abi"],
        "bytecode": "0x" + compiled["evm"]["bytecode"]["object"],
        "deployedBytecode": "0x" + compiled["evm"]["deployedBytecode"]["object"],
    }
    return json.dumps(artifact, indent=2, sort_keys=True) + "\n"


def artifact_path() -> Path:
    return ARTIFACTS / f"{CONTRACT}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail if the committed artifact differs from a fresh build")
    args = parser.parse_args(argv)
    try:
        text = build()
    except BuildError as exc:
        print(f"agentpay.chain.build: {exc}", file=sys.stderr)
        return 2
    target = artifact_path()
    if args.check:
        if not target.is_file() or target.read_text() != text:
            print(f"{target} differs from a fresh build; run python -m agentpay.chain.build", file=sys.stderr)
            return 1
        print(f"{target} matches a fresh build")
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
