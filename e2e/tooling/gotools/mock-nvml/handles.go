package main

// #include <stdlib.h>
import "C"

import "unsafe"

// handles gives C callers pointers for the mock's Go objects (GPUs, MIG devices, GPU and compute
// instances, event sets): the same pointer for the same object while it lives, and never a pointer
// that C could be holding for another one. Each is a byte of C memory that is never freed, so a
// handle to a destroyed instance stays distinct and is answered NVML_ERROR_INVALID_ARGUMENT.
type handles struct {
	objects  map[unsafe.Pointer]any
	pointers map[any]unsafe.Pointer
}

func newHandles() *handles {
	return &handles{objects: map[unsafe.Pointer]any{}, pointers: map[any]unsafe.Pointer{}}
}

func (h *handles) of(obj any) unsafe.Pointer {
	if p, ok := h.pointers[obj]; ok {
		return p
	}
	p := C.malloc(1)
	h.pointers[obj] = p
	h.objects[p] = obj
	return p
}

func (h *handles) lookup(p unsafe.Pointer) (any, bool) {
	obj, ok := h.objects[p]
	return obj, ok && obj != nil
}

// retire keeps the pointer taken, answering nothing, so it is never handed out again.
func (h *handles) retire(obj any) {
	if p, ok := h.pointers[obj]; ok {
		h.objects[p] = nil
		delete(h.pointers, obj)
	}
}

// getenv reads the process environment as it is now: Go's os.Getenv sees a copy taken when the
// library was loaded, and the host process may set variables between nvmlInit calls.
func getenv(name string) string {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	if value := C.getenv(cname); value != nil {
		return C.GoString(value)
	}
	return ""
}
