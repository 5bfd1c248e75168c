/* Runs what a CUDA program's first steps are, through the driver API only (no toolkit needed):
   load libcuda.so.1 as the loader finds it, init, name the devices, allocate, fill and read back. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult; typedef int CUdevice; typedef void *CUcontext; typedef unsigned long long CUdeviceptr;
#define LOAD(name) name##_t name = (name##_t)dlsym(lib, #name); if (!name) { printf("FAIL symbol %s\n", #name); return 2; }
#define CHECK(call) do { CUresult r = (call); if (r) { printf("FAIL %s -> %d\n", #call, r); return 3; } } while (0)
typedef CUresult (*cuInit_t)(unsigned);
typedef CUresult (*cuDeviceGetCount_t)(int *);
typedef CUresult (*cuDeviceGet_t)(CUdevice *, int);
typedef CUresult (*cuDeviceGetName_t)(char *, int, CUdevice);
typedef CUresult (*cuDeviceTotalMem_v2_t)(size_t *, CUdevice);
typedef CUresult (*cuDriverGetVersion_t)(int *);
typedef CUresult (*cuCtxCreate_v2_t)(CUcontext *, unsigned, CUdevice);
typedef CUresult (*cuMemAlloc_v2_t)(CUdeviceptr *, size_t);
typedef CUresult (*cuMemsetD8_v2_t)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*cuMemcpyDtoH_v2_t)(void *, CUdeviceptr, size_t);
typedef CUresult (*cuMemFree_v2_t)(CUdeviceptr);
int main(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) { printf("FAIL dlopen libcuda.so.1: %s\n", dlerror()); return 1; }
  LOAD(cuInit) LOAD(cuDeviceGetCount) LOAD(cuDeviceGet) LOAD(cuDeviceGetName) LOAD(cuDeviceTotalMem_v2)
  LOAD(cuDriverGetVersion) LOAD(cuCtxCreate_v2) LOAD(cuMemAlloc_v2) LOAD(cuMemsetD8_v2) LOAD(cuMemcpyDtoH_v2) LOAD(cuMemFree_v2)
  int version = 0, count = 0;
  CHECK(cuInit(0)); CHECK(cuDriverGetVersion(&version)); CHECK(cuDeviceGetCount(&count));
  printf("cuda driver %d, %d device(s)\n", version, count);
  for (int i = 0; i < count; i++) {
    CUdevice dev; char name[256]; size_t total; CUcontext ctx; CUdeviceptr p; size_t n = 64u << 20;
    CHECK(cuDeviceGet(&dev, i)); CHECK(cuDeviceGetName(name, sizeof name, dev)); CHECK(cuDeviceTotalMem_v2(&total, dev));
    CHECK(cuCtxCreate_v2(&ctx, 0, dev)); CHECK(cuMemAlloc_v2(&p, n)); CHECK(cuMemsetD8_v2(p, 0x5a, n));
    unsigned char *host = malloc(n); memset(host, 0, n); CHECK(cuMemcpyDtoH_v2(host, p, n));
    size_t bad = 0; for (size_t k = 0; k < n; k++) bad += host[k] != 0x5a;
    CHECK(cuMemFree_v2(p));
    printf("device %d: %s, %zu MiB; 64 MiB filled on the GPU and read back: %s\n", i, name, total >> 20, bad ? "MISMATCH" : "ok");
    if (bad) return 4;
  }
  printf("CUDA OK\n");
  return count > 0 ? 0 : 5;
}
