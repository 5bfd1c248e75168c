#!/usr/bin/env bash
# Every static check of deploy/ and e2e/kind/ in one go (no cluster needed):
#   unit_tests/test_deploy_static.py  YAML of every manifest and the kind config, example shape,
#                                     DeviceClass sync, bash -n, shellcheck (when installed),
#                                     helm lint/template/schema rejections (when Go or a cached
#                                     helm is available)
#   deploy/checks/hadolint.sh         the Dockerfile (skipped without hadolint unless
#                                     REQUIRE_HADOLINT=1)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-${root}/.venv/bin/python}"

cd "${root}"
"${python}" -m pytest -q unit_tests/test_deploy_static.py
bash deploy/checks/hadolint.sh
