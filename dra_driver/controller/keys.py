"""The annotation keys and size limits the controller reads and writes (part of its wire format)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver import CONFIG_API_GROUP
from dra_driver.k8s.claims import annotations_of

ALLOCATE_ANNOTATION = f"{CONFIG_API_GROUP}/allocate"
ALLOCATE_VALUE = "controller"
EXPLANATION_ANNOTATION = f"{CONFIG_API_GROUP}/explanation"
SUMMARY_ANNOTATION = f"{CONFIG_API_GROUP}/explanation-summary"
HASH_ANNOTATION = f"{CONFIG_API_GROUP}/explanation-hash"
EXPLAINED_BY_ANNOTATION = f"{CONFIG_API_GROUP}/explained-by"
OUR_ANNOTATIONS = (EXPLANATION_ANNOTATION, SUMMARY_ANNOTATION, HASH_ANNOTATION, EXPLAINED_BY_ANNOTATION)
REPORTING_CONTROLLER = f"{CONFIG_API_GROUP}/controller"

MAX_EXPLANATION_BYTES = 32 * 1024
MAX_SUMMARY_BYTES = 1024
MAX_EVENT_NOTE = 1024


def wants_controller_allocation(claim: Mapping[str, Any]) -> bool:
    return annotations_of(claim).get(ALLOCATE_ANNOTATION) == ALLOCATE_VALUE
