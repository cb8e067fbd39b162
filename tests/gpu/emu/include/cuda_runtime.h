// strata CUDA emulator: stands in for the CUDA Toolkit header of this name (STRATA_CUDA=EMU).
#pragma once
#include "../cuda_emu_device.hpp"
