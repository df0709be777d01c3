/* device_launch_parameters.h of the CUDA emulator: everything is in cuda_runtime.h. */
#pragma once
#include <cuda_runtime.h>
