// The target of every NVML function go-nvml's own cgo wrappers reference but this library does not
// implement: the build links them here (a PROVIDE script generated from nvml.h) and keeps them
// out of the dynamic symbol table, so a dlopen with RTLD_NOW succeeds and callers looking a
// function up see it missing, as with an older driver.
#include <nvml.h>

nvmlReturn_t draMockNvmlNotImplemented(void) { return NVML_ERROR_FUNCTION_NOT_FOUND; }
