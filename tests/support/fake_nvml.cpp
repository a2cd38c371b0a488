// A stand-in for libnvidia-ml.so.1 with the few entry points gpu_sample.cpp loads (STUB: owned
// by a helper).
extern "C" int nvmlInit_v2() { return 0; }
