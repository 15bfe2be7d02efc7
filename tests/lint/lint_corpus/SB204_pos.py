import torch
import triton
import triton.language as tl


def launch(x, kernel, kernel2):
    props = torch.cuda.get_device_properties(x.device)
    num_sms = props.multi_processor_count
    grid = (min(num_sms, triton.cdiv(x.shape[0], 128)),)  # expect: SB204
    kernel[grid](x)
    kernel2[(num_sms * 2,)](x)  # expect: SB204
    split = triton.runtime.driver.active.utils.get_device_properties(0)["multiprocessor_count"] // 4  # expect: SB204
    return split


@triton.jit
def persistent(x, n_tiles, NUM_SMS: tl.constexpr):
    for tile in tl.range(tl.program_id(0), n_tiles, NUM_SMS):  # expect: SB204
        pass


def host(x):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    waves = sms * 4  # expect: SB204
    for i in range(sms):  # expect: SB204
        pass
    return waves
