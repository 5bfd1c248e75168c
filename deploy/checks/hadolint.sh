#!/usr/bin/env bash
# Lint deploy/image/Dockerfile with hadolint.
#
# hadolint is not packaged for Debian 12 and is a Haskell program, so it is often missing. Then
# this script prints that it skipped and exits 0, unless REQUIRE_HADOLINT=1, in which case it
# fails. HADOLINT may name the binary (default: hadolint on PATH).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dockerfile="${root}/deploy/image/Dockerfile"
hadolint="${HADOLINT:-hadolint}"

if ! command -v "${hadolint}" >/dev/null 2>&1; then
  if [[ "${REQUIRE_HADOLINT:-0}" == "1" ]]; then
    echo "hadolint: not found (REQUIRE_HADOLINT=1); install it from https://github.com/hadolint/hadolint/releases or set HADOLINT=/path/to/hadolint" >&2
    exit 1
  fi
  echo "hadolint: skipped (not installed; Debian has no package). Set REQUIRE_HADOLINT=1 to make this an error."
  exit 0
fi

"${hadolint}" --failure-threshold warning "${dockerfile}"
echo "hadolint: ${dockerfile#"${root}"/} ok"
