#!/usr/bin/env bash
# End-to-end run on a kind cluster with simulated GPUs, installed as a user installs it:
#   create the cluster (e2e/suites/kind/kind-config.yaml: 1 control plane, 2 GPU workers and a CPU-only
#   one, CDI, DRA gates), building the image meanwhile (deploy/image/build.py, as `make image`) -> `kind load` it ->
#   `helm install` the chart with gpuBackend=simulated on worker 1 -> `helm install` it a second time
#   with apiProfile=nvidia (NVIDIA's driver name and classes, profile nvidia-examples) on worker 3
#   -> wait for the plugins ->
#   pytest e2e/suites -m "not testbed_only" with E2E_CLUSTER=kind (the shared suite) ->
#   pytest e2e/suites/kind (what only a real install shows: registration from the DaemonSet, RBAC from
#   inside the pods, leader election, helm upgrade and uninstall, a non-default kubelet root).
# The cluster is deleted on exit unless KEEP_CLUSTER=1.
#
# On a host with Docker, kind, kubectl and helm, it uses them as they are. `make e2e-kind`
# (DRA_KIND_BED=1) instead brings everything up from this repository's pins, with no registry:
# the bed's own dockerd (e2e/testbed/docker.py), a kind node image assembled from the pinned
# Kubernetes, containerd, runc, CNI, etcd, CoreDNS, kindnetd and local-path builds, and the pinned
# kind, kubectl and helm (e2e/testbed/kindnode.py).
#
# Environment:
#   DRA_KIND_BED=1     use the bed's dockerd, node image and pinned tools (what CI does)
#   CLUSTER_NAME       kind cluster name                          (default dra-driver-e2e)
#   KIND_NODE_IMAGE    node image overriding kind-config.yaml     (default: the config's, or the bed's)
#   KEEP_CLUSTER=1     keep the cluster (and reuse it if it exists)
#   SKIP_BUILD=1       do not rebuild the image (it must exist locally)
#   IMAGE              image name                                 (default dra-driver:e2e)
#   SIMULATED_PROFILE  simulated node profile                     (default kind-mixed: H100s and MIG A100s on one node)
#   HELM, KIND, KUBECTL  binaries (default: on PATH; helm is built by deploy/checks/helm.py if absent)
#   PYTHON             Python with pytest and the project installed (default .venv/bin/python)
#   PYTEST_ARGS        extra pytest arguments
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "${ROOT}"

CLUSTER_NAME="${CLUSTER_NAME:-dra-driver-e2e}"
IMAGE="${IMAGE:-dra-driver:e2e}"
NAMESPACE="dra-driver"
RELEASE="dra-driver"
# The second release, NVIDIA's API (--api-profile nvidia): e2e/suites/test_nvidia_profile.py.
NV_NAMESPACE="dra-driver-nvidia"
NV_RELEASE="dra-driver-nvidia"
NV_LABEL="e2e.dra-driver.io/api-profile"
# On those nodes, the stand-in nvidia-smi and MPS control (e2e/testbed/standins) as the simulated
# GPUs' driver root: the plugin programs time-slicing and runs MPS daemons through them.
NV_STANDIN_ROOT="/opt/dra-driver-e2e/standin-driver-root"
SIMULATED_PROFILE="${SIMULATED_PROFILE:-kind-mixed}"
KIND_CONFIG="${ROOT}/e2e/suites/kind/kind-config.yaml"
KUBECONFIG_FILE="${ROOT}/.run/kind-${CLUSTER_NAME}.kubeconfig"
PYTHON="${PYTHON:-${ROOT}/.venv/bin/python}"

log() { printf '\n=== %s\n' "$*" >&2; }
die() { printf 'run-e2e: %s\n' "$*" >&2; exit 1; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is required but not on PATH ($2)"
}

# ---- tools -------------------------------------------------------------------------------------
started_at=$(date +%s)
[[ -x "${PYTHON}" ]] || die "PYTHON=${PYTHON} not found (create the venv: python -m venv .venv && .venv/bin/pip install -e '.[dev]')"
mkdir -p "$(dirname "${KUBECONFIG_FILE}")"
# The image builds in the background while the node image is assembled and kind creates the
# cluster: those mostly wait on Debian's packages, Docker and the nodes' containers, so on a 2-core
# machine the build costs the run little.
build_pid=""
build_log="${ROOT}/.run/kind-image-build.log"
start_image_build() {
  if [[ "${SKIP_BUILD:-0}" != "1" && -z "${build_pid}" ]]; then
    log "building ${IMAGE} in the background (deploy/image/build.py, as make image; log ${build_log})"
    "${PYTHON}" deploy/image/build.py --tag "${IMAGE}" >"${build_log}" 2>&1 &
    build_pid=$!
  fi
}
created=0
cleanup() {
  local rc=$?
  if [[ -n "${build_pid:-}" ]]; then
    kill "${build_pid}" 2>/dev/null || true
    wait "${build_pid}" 2>/dev/null || true
  fi
  if [[ "${rc}" -ne 0 ]] && kind get clusters 2>/dev/null | grep -qx "${CLUSTER_NAME}"; then
    log "failure (rc=${rc}): plugin pods and logs"
    kubectl --kubeconfig "${KUBECONFIG_FILE}" -n "${NAMESPACE}" get pods -o wide || true
    kubectl --kubeconfig "${KUBECONFIG_FILE}" -n "${NAMESPACE}" logs -l app.kubernetes.io/component=kubelet-plugin --tail=100 --prefix || true
    kubectl --kubeconfig "${KUBECONFIG_FILE}" -n "${NAMESPACE}" logs -l app.kubernetes.io/component=controller --tail=60 --prefix || true
    kubectl --kubeconfig "${KUBECONFIG_FILE}" -n "${NAMESPACE}" logs -l app.kubernetes.io/component=controller --tail=60 --prefix --previous || true
    kubectl --kubeconfig "${KUBECONFIG_FILE}" -n "${NAMESPACE}" get events --sort-by=.lastTimestamp | tail -20 || true
    kubectl --kubeconfig "${KUBECONFIG_FILE}" -n "${NV_NAMESPACE}" get pods -o wide || true
    kubectl --kubeconfig "${KUBECONFIG_FILE}" -n "${NV_NAMESPACE}" logs -l app.kubernetes.io/component=kubelet-plugin --tail=60 --prefix || true
    kubectl --kubeconfig "${KUBECONFIG_FILE}" -n "${NV_NAMESPACE}" logs -l app.kubernetes.io/component=controller --tail=40 --prefix || true
  fi
  if [[ "${KEEP_CLUSTER:-0}" == "1" ]]; then
    echo "run-e2e: keeping cluster ${CLUSTER_NAME}; KUBECONFIG=${KUBECONFIG_FILE}" >&2
  elif [[ "${created}" == "1" ]]; then
    log "deleting cluster ${CLUSTER_NAME}"
    kind delete cluster --name "${CLUSTER_NAME}" || true
  fi
  if [[ "${DRA_KIND_BED:-0}" == "1" && "${KEEP_CLUSTER:-0}" != "1" ]]; then
    log "stopping the bed's dockerd (its image cache stays)"
    "${PYTHON}" -m e2e.testbed.docker down || true
  fi
  exit "${rc}"
}
trap cleanup EXIT
if [[ "${DRA_KIND_BED:-0}" == "1" ]]; then
  log "the bed: private dockerd, pinned kind node image and tools"
  "${PYTHON}" -m e2e.testbed.docker up
  eval "$("${PYTHON}" -m e2e.testbed.docker env)"
  start_image_build
  eval "$("${PYTHON}" -m e2e.testbed.kindnode env)"
fi
KIND="${KIND:-$(command -v kind || true)}"
KUBECTL="${KUBECTL:-$(command -v kubectl || true)}"
need docker "https://docs.docker.com/engine/install/"
[[ -n "${KIND}" && -x "${KIND}" ]] || die "kind is required (https://kind.sigs.k8s.io/docs/user/quick-start/#installation, or KIND=/path)"
[[ -n "${KUBECTL}" && -x "${KUBECTL}" ]] || die "kubectl is required (https://kubernetes.io/docs/tasks/tools/, or KUBECTL=/path)"
kind() { "${KIND}" "$@"; }
kubectl() { "${KUBECTL}" "$@"; }
if [[ -z "${HELM:-}" ]]; then
  if command -v helm >/dev/null 2>&1; then
    HELM="$(command -v helm)"
  elif command -v go >/dev/null 2>&1; then
    HELM="$("${PYTHON}" deploy/checks/helm.py --print-path)"
  else
    die "helm is required (install it, set HELM=/path/to/helm, or install Go so deploy/checks/helm.py can build it)"
  fi
fi
[[ -x "${HELM}" ]] || die "HELM=${HELM} is not executable"
docker info >/dev/null 2>&1 || die "cannot talk to the Docker daemon (is it running, and may this user use it?)"
export KIND KUBECTL HELM
# The suite's own kubectl calls use the same binary.
PATH="$(dirname "${KUBECTL}"):${PATH}"
export PATH

# ---- cluster -----------------------------------------------------------------------------------
start_image_build
if kind get clusters 2>/dev/null | grep -qx "${CLUSTER_NAME}"; then
  [[ "${KEEP_CLUSTER:-0}" == "1" ]] || die "cluster ${CLUSTER_NAME} already exists; delete it or set KEEP_CLUSTER=1 to reuse it"
  log "reusing cluster ${CLUSTER_NAME}"
else
  log "creating cluster ${CLUSTER_NAME}"
  image_args=()
  if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then
    image_args=(--image "${KIND_NODE_IMAGE}")
  fi
  created=1
  kind create cluster --name "${CLUSTER_NAME}" --config "${KIND_CONFIG}" "${image_args[@]}" --wait 300s
fi
kind get kubeconfig --name "${CLUSTER_NAME}" >"${KUBECONFIG_FILE}"
export KUBECONFIG="${KUBECONFIG_FILE}"

server_minor="$(kubectl version -o json | "${PYTHON}" -c 'import json,sys; print(int("".join(c for c in json.load(sys.stdin)["serverVersion"]["minor"] if c.isdigit())))')"
[[ "${server_minor}" -ge 36 ]] || die "the cluster runs Kubernetes 1.${server_minor}; the suite needs 1.36+"

if [[ "${DRA_KIND_BED:-0}" == "1" ]]; then
  # The suite's pods run busybox:1.36; with no registry, the bed's archive of Debian's busybox-static
  # (the real node's too) is loaded into the nodes instead of being pulled.
  log "loading busybox:1.36 (Debian's busybox-static, e2e/testbed/images.py) into the nodes"
  archive="$("${PYTHON}" -c 'import sys, pathlib; from e2e.testbed import images
print(images.build_all(pathlib.Path(sys.argv[1]))[images.BUSYBOX_IMAGE])' "${ROOT}/.run/kind-images")"
  kind load image-archive "${archive}" --name "${CLUSTER_NAME}"
fi

# CDI must be on in every node's containerd (the plugin hands CDI device IDs to the runtime):
# containerd 1.7 needs enable_cdi = true; 2.x has no such key (CDI is always on) and shows its
# cdi_spec_dirs instead.
for node in $(kind get nodes --name "${CLUSTER_NAME}"); do
  dump="$(docker exec "${node}" containerd config dump 2>/dev/null || true)"
  if ! grep -Eq '^\s*enable_cdi\s*=\s*true' <<<"${dump}" \
     && ! { grep -Eq '^\s*cdi_spec_dirs\s*=.*/var/run/cdi' <<<"${dump}" && ! grep -Eq '^\s*enable_cdi\s*=\s*false' <<<"${dump}"; }; then
    die "containerd on ${node} does not have CDI on with /var/run/cdi (check containerdConfigPatches in ${KIND_CONFIG})"
  fi
done
# kind's --wait covers the control plane; the workers follow a little later.
kubectl wait --for=condition=Ready nodes --all --timeout=180s

# ---- image -------------------------------------------------------------------------------------
if [[ -n "${build_pid}" ]]; then
  log "waiting for the image build"
  if ! wait "${build_pid}"; then
    build_pid=""
    cat "${build_log}" >&2
    die "building ${IMAGE} failed (its output is above, and in ${build_log})"
  fi
  build_pid=""
  tail -n 3 "${build_log}" >&2
fi
log "loading ${IMAGE} into the kind nodes"
kind load docker-image "${IMAGE}" --name "${CLUSTER_NAME}"

# ---- driver ------------------------------------------------------------------------------------
# The suite's install serves worker 1 (default kubelet root); worker 2's kubelet runs at a
# non-default root and is left to e2e/suites/kind/test_lifecycle.py.
log "installing the chart (gpuBackend=simulated, profile ${SIMULATED_PROFILE})"
"${HELM}" upgrade --install "${RELEASE}" deploy/helm/dra-driver \
  --namespace "${NAMESPACE}" --create-namespace \
  --set image.repository="${IMAGE%%:*}" \
  --set image.tag="${IMAGE##*:}" \
  --set image.pullPolicy=Never \
  --set gpuBackend=simulated \
  --set simulatedProfile="${SIMULATED_PROFILE}" \
  --set logFormat=console \
  --set logLevel=debug \
  --set-json 'kubeletPlugin.nodeSelector={"e2e.dra-driver.io/kubelet-root":"default"}' \
  --wait --timeout 5m

if [[ "${created}" != "1" ]]; then
  # A reused cluster may run the previous build under the same tag: restart onto the new one.
  kubectl -n "${NAMESPACE}" rollout restart "daemonset/${RELEASE}-kubelet-plugin" "deployment/${RELEASE}-controller"
fi
log "waiting for the kubelet plugins"
kubectl -n "${NAMESPACE}" rollout status "daemonset/${RELEASE}-kubelet-plugin" --timeout=300s
workers="$(kubectl get nodes --no-headers -l e2e.dra-driver.io/kubelet-root=default | wc -l)"
slices=0
for _ in $(seq 1 60); do
  slices="$(kubectl get resourceslices --field-selector spec.driver=gpu.dra-driver.io --no-headers 2>/dev/null | wc -l)"
  [[ "${slices}" -ge "${workers}" ]] && break
  sleep 2
done
kubectl get resourceslices --field-selector spec.driver=gpu.dra-driver.io
[[ "${slices}" -ge "${workers}" ]] || die "expected ResourceSlices from ${workers} worker nodes, found ${slices}"

# NVIDIA's API as a second release, as a user moving nodes from NVIDIA's DRA driver would run it
# (docs/upgrading.md): the same chart and image, apiProfile nvidia (driver gpu.nvidia.com, the
# classes gpu.nvidia.com and mig.nvidia.com), on the nodes labelled for it only: worker 3. The
# first release's nodeSelector keeps it off that node, so no node has two plugins of one driver.
# Worker 3 carries no GPU label (test_defaults.py needs it CPU-only for the chart's defaults), so
# gpuNodeLabels is emptied and the label alone places the plugin. nvidia.com/gpu stays the first
# release's: Kubernetes serves an extended resource through one class, and the shared scenarios
# use that one.
nv_nodes="$(kubectl get nodes -l "${NV_LABEL}=nvidia" -o jsonpath='{.items[*].metadata.name}')"
[[ -n "${nv_nodes}" ]] || die "no node is labelled ${NV_LABEL}=nvidia (${KIND_CONFIG})"
standins="$(mktemp -d)"
"${PYTHON}" -m e2e.testbed.standins.install "${standins}/root" --python /opt/dra-driver/bin/python >/dev/null
for node in ${nv_nodes}; do
  # Fresh on every run: the tests count what the stand-ins were asked.
  docker exec "${node}" sh -c "rm -rf '${NV_STANDIN_ROOT}' && mkdir -p '$(dirname "${NV_STANDIN_ROOT}")'"
  docker cp "${standins}/root" "${node}:${NV_STANDIN_ROOT}"
done
rm -rf "${standins}"
log "installing the chart a second time (apiProfile=nvidia, profile nvidia-examples) on the ${NV_LABEL}=nvidia nodes"
"${HELM}" upgrade --install "${NV_RELEASE}" deploy/helm/dra-driver \
  --namespace "${NV_NAMESPACE}" --create-namespace \
  --set image.repository="${IMAGE%%:*}" \
  --set image.tag="${IMAGE##*:}" \
  --set image.pullPolicy=Never \
  --set gpuBackend=simulated \
  --set apiProfile=nvidia \
  --set simulatedProfile=nvidia-examples \
  --set simulated.driverRoot="${NV_STANDIN_ROOT}" \
  --set deviceClasses.extendedResourceName= \
  --set logFormat=console \
  --set-json 'kubeletPlugin.gpuNodeLabels=[]' \
  --set-json "kubeletPlugin.nodeSelector={\"${NV_LABEL}\":\"nvidia\"}" \
  --wait --timeout 5m
if [[ "${created}" != "1" ]]; then
  kubectl -n "${NV_NAMESPACE}" rollout restart "daemonset/${NV_RELEASE}-kubelet-plugin" "deployment/${NV_RELEASE}-controller"
fi
kubectl -n "${NV_NAMESPACE}" rollout status "daemonset/${NV_RELEASE}-kubelet-plugin" --timeout=300s
kubectl -n "${NV_NAMESPACE}" rollout status "deployment/${NV_RELEASE}-controller" --timeout=300s
for node in ${nv_nodes}; do
  [[ -z "$(kubectl get resourceslices --field-selector "spec.nodeName=${node},spec.driver=gpu.dra-driver.io" --no-headers 2>/dev/null)" ]] \
    || die "${node} has ResourceSlices of gpu.dra-driver.io: the first release must not run on the nvidia-profile node"
done
nv_slices=0
for _ in $(seq 1 60); do
  nv_slices="$(kubectl get resourceslices --field-selector spec.driver=gpu.nvidia.com --no-headers 2>/dev/null | wc -l)"
  [[ "${nv_slices}" -ge 1 ]] && break
  sleep 2
done
kubectl get resourceslices --field-selector spec.driver=gpu.nvidia.com
[[ "${nv_slices}" -ge 1 ]] || die "no ResourceSlice of gpu.nvidia.com from ${nv_nodes}"
log "cluster and driver ready after $(( $(date +%s) - started_at )) s"

# ---- tests -------------------------------------------------------------------------------------
export E2E_CLUSTER=kind
export E2E_DRIVER_NAMESPACE="${NAMESPACE}" E2E_RELEASE="${RELEASE}" E2E_IMAGE="${IMAGE}" E2E_KIND_CLUSTER="${CLUSTER_NAME}"
export SIMULATED_PROFILE
E2E_NVIDIA_PROFILE_NODES="$(tr ' ' ',' <<<"${nv_nodes}")"
export E2E_NVIDIA_PROFILE_NODES E2E_NVIDIA_RELEASE="${NV_RELEASE}" E2E_NVIDIA_NAMESPACE="${NV_NAMESPACE}" \
  E2E_NVIDIA_STANDIN_ROOT="${NV_STANDIN_ROOT}"
log "pytest e2e/suites -m 'not testbed_only' (the shared suite)"
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of words on purpose
"${PYTHON}" -m pytest e2e/suites -v -m "not testbed_only" --ignore=e2e/suites/kind ${PYTEST_ARGS:-}
log "pytest e2e/suites/kind (install, RBAC from the pods, upgrade, uninstall, kubelet root)"
# shellcheck disable=SC2086
"${PYTHON}" -m pytest e2e/suites/kind -v ${PYTEST_ARGS:-}
log "kind run passed in $(( $(date +%s) - started_at )) s"
