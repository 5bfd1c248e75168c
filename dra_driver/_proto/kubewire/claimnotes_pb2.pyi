from dra_driver._proto.kubewire import meta_pb2 as _meta_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NotedClaimList(_message.Message):
    __slots__ = ("metadata", "items")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    metadata: _meta_pb2.ListMeta
    items: _containers.RepeatedCompositeFieldContainer[NotedClaim]
    def __init__(self, metadata: _Optional[_Union[_meta_pb2.ListMeta, _Mapping]] = ..., items: _Optional[_Iterable[_Union[NotedClaim, _Mapping]]] = ...) -> None: ...

class NotedClaim(_message.Message):
    __slots__ = ("metadata", "spec", "status")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    metadata: NotedMeta
    spec: NotedSpec
    status: NotedStatus
    def __init__(self, metadata: _Optional[_Union[NotedMeta, _Mapping]] = ..., spec: _Optional[_Union[NotedSpec, _Mapping]] = ..., status: _Optional[_Union[NotedStatus, _Mapping]] = ...) -> None: ...

class NotedMeta(_message.Message):
    __slots__ = ("name", "namespace", "deletionTimestamp", "annotations")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DELETIONTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    deletionTimestamp: _meta_pb2.Time
    annotations: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., deletionTimestamp: _Optional[_Union[_meta_pb2.Time, _Mapping]] = ..., annotations: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NotedSpec(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: NotedDeviceClaim
    def __init__(self, devices: _Optional[_Union[NotedDeviceClaim, _Mapping]] = ...) -> None: ...

class NotedDeviceClaim(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[NotedRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[NotedRequest, _Mapping]]] = ...) -> None: ...

class NotedRequest(_message.Message):
    __slots__ = ("name", "exactly", "firstAvailable")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXACTLY_FIELD_NUMBER: _ClassVar[int]
    FIRSTAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    exactly: NotedExactRequest
    firstAvailable: _containers.RepeatedCompositeFieldContainer[NotedSubRequest]
    def __init__(self, name: _Optional[str] = ..., exactly: _Optional[_Union[NotedExactRequest, _Mapping]] = ..., firstAvailable: _Optional[_Iterable[_Union[NotedSubRequest, _Mapping]]] = ...) -> None: ...

class NotedExactRequest(_message.Message):
    __slots__ = ("deviceClassName",)
    DEVICECLASSNAME_FIELD_NUMBER: _ClassVar[int]
    deviceClassName: str
    def __init__(self, deviceClassName: _Optional[str] = ...) -> None: ...

class NotedSubRequest(_message.Message):
    __slots__ = ("name", "deviceClassName")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICECLASSNAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    deviceClassName: str
    def __init__(self, name: _Optional[str] = ..., deviceClassName: _Optional[str] = ...) -> None: ...

class NotedStatus(_message.Message):
    __slots__ = ("allocation",)
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    allocation: NotedAllocation
    def __init__(self, allocation: _Optional[_Union[NotedAllocation, _Mapping]] = ...) -> None: ...

class NotedAllocation(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: NotedDeviceAllocation
    def __init__(self, devices: _Optional[_Union[NotedDeviceAllocation, _Mapping]] = ...) -> None: ...

class NotedDeviceAllocation(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[NotedResult]
    def __init__(self, results: _Optional[_Iterable[_Union[NotedResult, _Mapping]]] = ...) -> None: ...

class NotedResult(_message.Message):
    __slots__ = ("driver", "pool", "device")
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    driver: str
    pool: str
    device: str
    def __init__(self, driver: _Optional[str] = ..., pool: _Optional[str] = ..., device: _Optional[str] = ...) -> None: ...
