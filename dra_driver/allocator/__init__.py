"""The resolution engine: a ResourceClaim against ResourceSlices with the kube-scheduler's rules,
giving an allocation or an explanation of why there is none. Pure: it performs no I/O."""
