"""Prepare while the API server is unreachable: already-prepared claims answer from the checkpoint."""

from __future__ import annotations

from nodefix import Env, make_claim

from dra_driver.k8s.client import ApiError


def test_prepared_claim_answers_from_checkpoint_during_outage(env: Env) -> None:
    ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
    first = env.state.prepare([ref])[ref.uid]
    assert first.ok
    env.reader.errors[(ref.namespace, ref.name)] = RuntimeError("API server: connection refused")
    # A restarted plugin (and a restarted kubelet re-sending Prepare) during the outage.
    env.state.close()
    env.state = env.new_state()
    (env.cdi_root / f"k8s.gpu.dra-driver.io-claim_{ref.uid}.json").unlink()
    again = env.state.prepare([ref])[ref.uid]
    assert again == first
    assert env.spec_exists(ref.uid), "the spec a reboot wiped is re-written without the API server"


def test_unknown_claim_fails_with_the_api_error_during_outage(env: Env) -> None:
    ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
    env.reader.errors[(ref.namespace, ref.name)] = RuntimeError("API server: connection refused")
    out = env.state.prepare([ref])[ref.uid]
    assert out.error and "could not get ResourceClaim default/c" in out.error and "connection refused" in out.error
    assert not env.spec_exists(ref.uid)


def test_deleted_claim_is_not_answered_from_checkpoint(env: Env) -> None:
    ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
    assert env.state.prepare([ref])[ref.uid].ok
    env.reader.errors[(ref.namespace, ref.name)] = ApiError(404, "NotFound", "gone")
    out = env.state.prepare([ref])[ref.uid]
    assert out.error and "not found" in out.error
