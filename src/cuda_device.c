/*
 * cuda_device.c -- placeholder until the CUDA driver backend lands: "cuda:N"
 * reports that no CUDA device is available.
 */
#include "internal.h"

tp_status tp_cuda_device_create(tp_device *device, const tp_device_options *options) {
    (void)options;
    tp_logf(&device->logger, TP_LOG_ERROR, "cuda backend: not built into this version");
    return TP_ERR_NO_DEVICE;
}
