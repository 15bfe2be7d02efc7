import torch
import triton


def fingerprint():
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "sm_count": p.multi_processor_count}


def log_sms():
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"running on {num_sms} SMs")


def launch(x, kernel):
    grid = (triton.cdiv(x.shape[0], 128),)
    for i in range(x.shape[1]):
        pass
    kernel[grid](x)


@triton.jit
def persistent_offsets(offsets_ptr, NUM_SMS: tl.constexpr):
    tile = tl.program_id(0) * NUM_SMS
    start = tl.load(offsets_ptr + tile)  # data at an SM-derived address is data, not a count
    for i in range(0, start, 16):
        pass
