/* The Vulkan compute backend (gpu.h): instance and device, the shaders of shaders/ (compiled to
 * SPIR-V by glslc at build time and included as word arrays), the weight products, and the steps:
 * a forward step's operations recorded into one command buffer over activations that stay in
 * device-local memory, with the KV cache there.
 *
 * Memory: uploaded weights and the activations' codes live in device-local memory (a discrete GPU
 * reads its own memory, not the host's over the bus); the weights go there once through a
 * host-visible staging buffer, or are written in place where the device-local memory is
 * host-visible too (lavapipe, integrated GPUs). A product's activations and results go through
 * host-visible buffers. Those buffers, the descriptor sets, the command buffer and the fence are made
 * once and kept (the buffers grown when a product needs more), not made per product. */
#ifdef QUILL_VULKAN
#include "gpu/gpu.h"
#include "base/error.h"
#include "kernels/kernels_exact.h"

#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <vulkan/vulkan.h>

static const uint32_t spv_quantize[] =
#include "shaders/quantize.comp.inc"
    ;
static const uint32_t spv_product_exact[] =
#include "shaders/product_exact.comp.inc"
    ;
static const uint32_t spv_fma_probe[] =
#include "shaders/fma_probe.comp.inc"
    ;
static const uint32_t spv_product_tiled[] =
#include "shaders/product_tiled.comp.inc"
    ;
static const uint32_t spv_product_float[] =
#include "shaders/product_float.comp.inc"
    ;
static const uint32_t spv_rmsnorm[] =
#include "shaders/rmsnorm.comp.inc"
    ;
static const uint32_t spv_rope[] =
#include "shaders/rope.comp.inc"
    ;
static const uint32_t spv_kv_store[] =
#include "shaders/kv_store.comp.inc"
    ;
static const uint32_t spv_attention[] =
#include "shaders/attention.comp.inc"
    ;
static const uint32_t spv_glu[] =
#include "shaders/glu.comp.inc"
    ;
static const uint32_t spv_add_rows[] =
#include "shaders/add_rows.comp.inc"
    ;
static const uint32_t spv_scale[] =
#include "shaders/scale.comp.inc"
    ;
static const uint32_t spv_route_logits[] =
#include "shaders/route_logits.comp.inc"
    ;
static const uint32_t spv_route_select[] =
#include "shaders/route_select.comp.inc"
    ;
static const uint32_t spv_moe_sum[] =
#include "shaders/moe_sum.comp.inc"
    ;

typedef struct {
    VkBuffer buf;
    VkDeviceMemory mem;
    void *map;
    size_t bytes;
} gpu_buffer;

struct resident {
    const void *host;
    gpu_buffer buf;
};

/* product_exact.comp's and product_float.comp's kinds (exact_kind, float_kind) */
#define EXACT_KINDS 24
#define FLOAT_KINDS 4
/* product_tiled.comp's kinds: the exact kinds below this (exact_weights.glsl's has_weight_code) */
#define TILED_KINDS 13
/* product_tiled.comp's tile (rows and tokens) and workgroup, and the shared memory it takes */
#define TILE 64
#define TILED_WORKGROUP 256
#define TILED_SHARED_BYTES (2 * 32 * TILE * 4 + 4 * TILE * 4)
/* The most blocks of 32 of a float type's row (product_float.comp's MAX_BLOCKS: its shared memory),
 * and tokens, for which the split way takes their products (the exact ones: product_exact.comp's
 * PAIRS (row, token) pairs a workgroup; the float ones: a workgroup a pair) */
#define SPLIT_MAX_PARTS 1024
#define SPLIT_MAX_TOKENS 8
#define SPLIT_PAIRS 8
/* The products' pipelines, one per kind (the shaders' KIND, a specialization constant), follow the
 * others and are made at their first use (product_pipe): each then holds only its type's decoding,
 * which a pipeline of all the kinds paid for in every product (lavapipe: the Vulkan tests 2-3x
 * slower with the grid types added) and in the device's registers. */
enum { PIPE_QUANTIZE, PIPE_RMSNORM, PIPE_ROPE, PIPE_KV_STORE, PIPE_ATTENTION, PIPE_GLU, PIPE_ADD_ROWS, PIPE_SCALE,
       PIPE_ROUTE_LOGITS, PIPE_ROUTE_SELECT, PIPE_MOE_SUM, PIPE_EXACT_FIRST,
       PIPE_FLOAT_FIRST = PIPE_EXACT_FIRST + EXACT_KINDS, PIPE_TILED_FIRST = PIPE_FLOAT_FIRST + FLOAT_KINDS,
       PIPE_COUNT = PIPE_TILED_FIRST + TILED_KINDS };
/* the most push-constant words of a shader (attention's 16) */
#define PUSH_WORDS 16
/* (the fifth: the experts' ids of a mixture-of-experts layer's products; the sixth: the grid
 * types' lattice tables; unused ones bind the first buffer) */
#define BINDINGS 6
#define WORKGROUP 64
/* attention.comp's MAX_KEPT: the scores of at most this many positions kept in shared memory */
#define ATTENTION_KEPT 2048

/* QUILL_VULKAN_PROFILE=1: each step's dispatches timed on the device (a timestamp after each one's
 * barrier: the time since the one before), summed per shader (and per way for the products), and
 * the host's time recording and waiting; logged at close (QUILL_LOG=info shows it). Labels: the
 * pipelines, then the products' pipelines again for their split way, then copies. */
#define PROFILE_QUERIES 8192
#define PROFILE_LABELS (2 * PIPE_COUNT + 1)
typedef struct {
    VkQueryPool pool;
    double period_ns; /* a timestamp tick */
    uint32_t used;    /* queries written in this step */
    uint16_t label[PROFILE_QUERIES];
    uint64_t ticks[PROFILE_QUERIES]; /* a step's timestamps, read back */
    double ns[PROFILE_LABELS];
    uint64_t calls[PROFILE_LABELS];
    double record_ns, wait_ns, begin_ns;
    uint64_t steps, dropped;
} gpu_profile;

/* The steps' descriptor sets, kept across steps by their buffers and offsets: a model's steps
 * bind the same buffers at the same offsets token after token, and writing a set is most of what
 * recording a dispatch costs the host (an H200 step of TinyLlama: 1 ms of recording for 450
 * dispatches). Emptied whenever a buffer is freed (a handle may come back for another buffer). */
#define SET_CACHE_SLOTS 4096
#define SET_CACHE_MAX 3072
typedef struct {
    VkBuffer buf[BINDINGS];
    VkDeviceSize offset[BINDINGS];
    VkDescriptorSet set; /* VK_NULL_HANDLE: an empty slot */
} cached_set;

/* A step's operation, kept so that a step like the one before (a token of generation after another,
 * the same bindings, push constants and sizes) submits the command buffer recorded for that one
 * instead of recording it again. Zeroed before filling: steps compare them bytewise. */
typedef enum { OP_DISPATCH, OP_COPY_IN, OP_COPY, OP_COPY_OUT } step_op_kind;
typedef struct {
    step_op_kind kind;
    int pipe;       /* OP_DISPATCH: the pipeline and its profile label */
    int label;
    uint32_t words; /* push constants */
    uint32_t push[PUSH_WORDS];
    VkDescriptorSet set;
    uint64_t groups;
    VkDeviceSize from, to, bytes; /* the copies: byte offsets (io or act to act, act to io) */
} step_op;

struct quill_gpu {
    VkInstance instance;
    VkDebugUtilsMessengerEXT messenger;
    VkPhysicalDevice phys;
    VkDevice device;
    VkQueue queue;
    uint32_t queue_family;
    VkCommandPool pool;
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout pipe_layout;
    VkPipeline pipes[PIPE_COUNT];
    uint32_t host_memory_type;   /* host-visible and coherent: activations in, results out */
    uint32_t device_memory_type; /* device-local: weights and codes */
    bool device_memory_mapped;   /* the device-local type is host-visible too: no staging */
    size_t staging_chunk;        /* bytes per staged copy */
    uint64_t memory;             /* device-local bytes it may use (quill_gpu_memory) */
    bool split;                  /* a few tokens' exact products as a workgroup per (row, token) */
    bool tiled;                  /* more tokens' exact products in tiles (product_tiled.comp) */
    bool native_fma;             /* GLSL's fma rounds once here (probe_fma): exact_math.glsl's NATIVE_FMA */
    bool cpu_device;             /* a CPU driver (lavapipe) */
    uint32_t dispatch_width;     /* workgroups in x at most (65535, what every device takes) */
    uint32_t attention_kept;     /* attention keeps at most this many scores (attention.comp's MAX_KEPT) */
    /* kept across products (a product at a time: the forward pass runs them in order) */
    VkDescriptorPool dpool;
    VkDescriptorSet sets[1 + QUILL_GPU_GROUP_MAX]; /* the quantizer's, then each product's */
    size_t offset_alignment;                        /* minStorageBufferOffsetAlignment */
    VkCommandBuffer cmd;
    VkFence fence;
    gpu_buffer x, codes, da, y, w; /* w: the weights of a product whose weights were not uploaded */
    gpu_buffer grids;              /* the grid i-quants' lattice tables (upload_grids) */
    /* a step (quill_gpu_step_begin .. quill_gpu_step_end): its activations in device-local memory,
     * its input, token table and output through io, one descriptor set per dispatch from step_pool
     * (reset per step), and the first failure while recording */
    gpu_buffer act, io, kv;
    VkDescriptorPool step_pool;
    int step_sets;
    size_t io_tokens_at; /* bytes: where the token table starts in io */
    uint64_t io_floats;
    bool stepping;
    quill_status step_status;
    quill_error step_err;
    int validation_errors;
    gpu_profile *profile; /* NULL unless QUILL_VULKAN_PROFILE=1 */
    VkDescriptorPool cache_pool;
    cached_set *set_cache; /* SET_CACHE_SLOTS, open addressing */
    int set_cache_used, set_cache_max;
    bool set_cache_stale; /* a step missed the full cache: emptied at the next step's start */
    /* a step's operations (ops) and those of the step recorded last into step_cmd (kept), which a
     * step with the same operations submits again while replay_ok (no buffer or kept set freed
     * since, and none of its sets from the step's own pool) */
    step_op *ops, *kept_ops;
    int n_ops, n_kept, cap_ops;
    bool ops_pool_set, replay_ok;
    VkCommandBuffer step_cmd;
    uint64_t replays; /* steps submitted again (quill_gpu_step_replays) */
    struct resident *resident; /* weights uploaded once (quill_gpu_upload) */
    int n_resident, cap_resident;
    char name[256];
};

bool quill_gpu_built(void) { return true; }

static quill_status vk_fail(quill_error *err, VkResult r, const char *what) {
    const bool oom = r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY;
    return quill_fail(err, oom ? QUILL_E_NOMEM : QUILL_E_UNSUPPORTED, "vulkan: %s failed (VkResult %d)%s", what, (int)r,
                      r == VK_ERROR_INCOMPATIBLE_DRIVER
                          ? ": no Vulkan driver (install mesa-vulkan-drivers for lavapipe, or your GPU's driver)"
                          : "");
}

static VKAPI_ATTR VkBool32 VKAPI_CALL on_validation(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                    VkDebugUtilsMessageTypeFlagsEXT types,
                                                    const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    (void)types;
    if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        ((quill_gpu *)user)->validation_errors++;
        quill_log(QUILL_LOG_ERROR, "vulkan validation: %s", data->pMessage ? data->pMessage : "(no message)");
    }
    return VK_FALSE;
}

static bool validation_wanted(void) {
    const char *v = getenv("QUILL_VULKAN_VALIDATION");
    return v && *v && strcmp(v, "0") != 0;
}

/* An instance (1.1: subgroup properties), with the validation layer when asked for (g: NULL when
 * only enumerating). */
static quill_status make_instance(quill_gpu *g, VkInstance *out, quill_error *err) {
    const VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "quill",
                                   .apiVersion = VK_API_VERSION_1_1};
    const char *layers[] = {"VK_LAYER_KHRONOS_validation"};
    const char *exts[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
    const bool validate = g && validation_wanted();
    const VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app,
                                     .enabledLayerCount = validate ? 1 : 0, .ppEnabledLayerNames = layers,
                                     .enabledExtensionCount = validate ? 1 : 0, .ppEnabledExtensionNames = exts};
    VkResult r = vkCreateInstance(&ci, NULL, out);
    if (r == VK_ERROR_LAYER_NOT_PRESENT)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "vulkan: QUILL_VULKAN_VALIDATION is set but the Khronos validation layer is not installed "
                          "(Debian: vulkan-validationlayers)");
    if (r != VK_SUCCESS) return vk_fail(err, r, "vkCreateInstance");
    if (validate) {
        PFN_vkCreateDebugUtilsMessengerEXT create =
            (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(*out, "vkCreateDebugUtilsMessengerEXT");
        const VkDebugUtilsMessengerCreateInfoEXT mi = {
            .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
            .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT,
            .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
            .pfnUserCallback = on_validation, .pUserData = g};
        if (!create || (r = create(*out, &mi, NULL, &g->messenger)) != VK_SUCCESS) {
            vkDestroyInstance(*out, NULL);
            return vk_fail(err, create ? r : VK_ERROR_EXTENSION_NOT_PRESENT, "vkCreateDebugUtilsMessengerEXT");
        }
    }
    return QUILL_OK;
}

static quill_status physical_devices(VkInstance inst, VkPhysicalDevice **out, uint32_t *n, quill_error *err) {
    VkResult r = vkEnumeratePhysicalDevices(inst, n, NULL);
    if (r != VK_SUCCESS) return vk_fail(err, r, "vkEnumeratePhysicalDevices");
    *out = calloc(*n ? *n : 1, sizeof **out);
    if (!*out) return quill_fail(err, QUILL_E_NOMEM, "vulkan: out of memory listing devices");
    r = vkEnumeratePhysicalDevices(inst, n, *out);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        free(*out);
        return vk_fail(err, r, "vkEnumeratePhysicalDevices");
    }
    return QUILL_OK;
}

static void describe(VkPhysicalDevice p, quill_gpu_device *d) {
    memset(d, 0, sizeof *d);
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(p, &props);
    VkPhysicalDeviceDriverProperties driver = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceSubgroupProperties sub = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    const bool v12 = props.apiVersion >= VK_API_VERSION_1_2;
    if (v12) sub.pNext = &driver;
    VkPhysicalDeviceProperties2 props2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sub};
    vkGetPhysicalDeviceProperties2(p, &props2);
    snprintf(d->name, sizeof d->name, "%s", props.deviceName);
    if (v12) snprintf(d->driver, sizeof d->driver, "%s: %s", driver.driverName, driver.driverInfo);
    else snprintf(d->driver, sizeof d->driver, "driver version %u", props.driverVersion);
    static const char *kinds[] = {"other", "integrated", "discrete", "virtual", "cpu"};
    snprintf(d->kind, sizeof d->kind, "%s", props.deviceType <= VK_PHYSICAL_DEVICE_TYPE_CPU ? kinds[props.deviceType] : "other");
    d->api_version = props.apiVersion;
    d->subgroup_size = sub.subgroupSize;
    VkPhysicalDeviceMemoryProperties mem;
    vkGetPhysicalDeviceMemoryProperties(p, &mem);
    for (uint32_t i = 0; i < mem.memoryHeapCount; i++)
        if (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) d->memory += mem.memoryHeaps[i].size;
    VkPhysicalDeviceFeatures f;
    vkGetPhysicalDeviceFeatures(p, &f);
    d->fp64 = f.shaderFloat64;
    d->int16 = f.shaderInt16;
    if (v12) {
        VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
        VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
        vkGetPhysicalDeviceFeatures2(p, &f2);
        d->fp16 = f12.shaderFloat16;
        d->int8 = f12.shaderInt8;
    }
}

quill_status quill_gpu_devices(quill_gpu_device *out, int max, int *n, quill_error *err) {
    *n = 0;
    VkInstance inst;
    quill_status s = make_instance(NULL, &inst, err);
    if (s) return s;
    VkPhysicalDevice *phys;
    uint32_t count;
    s = physical_devices(inst, &phys, &count, err);
    if (!s) {
        for (uint32_t i = 0; i < count && (int)i < max; i++) describe(phys[i], &out[i]);
        *n = (int)count;
        free(phys);
    }
    vkDestroyInstance(inst, NULL);
    return s;
}

const char *quill_gpu_name(const quill_gpu *g) { return g->name; }

uint64_t quill_gpu_memory(const quill_gpu *g) { return g->memory; }

int quill_gpu_validation_errors(const quill_gpu *g) { return g ? g->validation_errors : 0; }

/* product_exact.comp's kind of a type, or -1: the types with the CPU path's exact products */
static int exact_kind(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_Q4_0: return 0;
    case QUILL_TYPE_Q4_1: return 1;
    case QUILL_TYPE_Q5_0: return 2;
    case QUILL_TYPE_Q5_1: return 3;
    case QUILL_TYPE_Q8_0: return 4;
    case QUILL_TYPE_MXFP4: return 5;
    case QUILL_TYPE_Q4_K: return 6;
    case QUILL_TYPE_Q5_K: return 7;
    case QUILL_TYPE_Q6_K: return 8;
    case QUILL_TYPE_Q2_K: return 9;
    case QUILL_TYPE_Q3_K: return 10;
    case QUILL_TYPE_IQ4_NL: return 11;
    case QUILL_TYPE_IQ4_XS: return 12;
    case QUILL_TYPE_IQ2_XXS: return 13;
    case QUILL_TYPE_IQ2_XS: return 14;
    case QUILL_TYPE_IQ2_S: return 15;
    case QUILL_TYPE_IQ3_XXS: return 16;
    case QUILL_TYPE_IQ3_S: return 17;
    case QUILL_TYPE_IQ1_S: return 18;
    case QUILL_TYPE_IQ1_M: return 19;
    case QUILL_TYPE_TQ1_0: return 20;
    case QUILL_TYPE_TQ2_0: return 21;
    case QUILL_TYPE_Q1_0: return 22;
    case QUILL_TYPE_Q2_0: return 23;
    default: return -1;
    }
}

/* product_float.comp's kind of a type, or -1: the types the CPU path multiplies in f32 */
static int float_kind(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_F32: return 0;
    case QUILL_TYPE_F16: return 1;
    case QUILL_TYPE_BF16: return 2;
    case QUILL_TYPE_NVFP4: return 3;
    default: return -1;
    }
}

bool quill_gpu_supports(uint32_t type) { return float_kind(type) >= 0 || exact_kind(type) >= 0; }

static void buffer_free(quill_gpu *g, gpu_buffer *b);

static void profile_report(const quill_gpu *g);

void quill_gpu_close(quill_gpu *g) {
    if (!g) return;
    if (g->profile) {
        profile_report(g);
        if (g->profile->pool) vkDestroyQueryPool(g->device, g->profile->pool, NULL);
        free(g->profile);
    }
    if (g->device) {
        vkDeviceWaitIdle(g->device);
        for (int i = 0; i < g->n_resident; i++) buffer_free(g, &g->resident[i].buf);
        free(g->resident);
        buffer_free(g, &g->x), buffer_free(g, &g->codes), buffer_free(g, &g->da), buffer_free(g, &g->y);
        buffer_free(g, &g->w), buffer_free(g, &g->grids);
        buffer_free(g, &g->act), buffer_free(g, &g->io), buffer_free(g, &g->kv);
        if (g->step_pool) vkDestroyDescriptorPool(g->device, g->step_pool, NULL);
        if (g->cache_pool) vkDestroyDescriptorPool(g->device, g->cache_pool, NULL);
        free(g->set_cache);
        free(g->ops), free(g->kept_ops);
        if (g->fence) vkDestroyFence(g->device, g->fence, NULL);
        if (g->cmd) vkFreeCommandBuffers(g->device, g->pool, 1, &g->cmd);
        if (g->step_cmd) vkFreeCommandBuffers(g->device, g->pool, 1, &g->step_cmd);
        if (g->dpool) vkDestroyDescriptorPool(g->device, g->dpool, NULL);
        for (int i = 0; i < PIPE_COUNT; i++)
            if (g->pipes[i]) vkDestroyPipeline(g->device, g->pipes[i], NULL);
        if (g->pipe_layout) vkDestroyPipelineLayout(g->device, g->pipe_layout, NULL);
        if (g->set_layout) vkDestroyDescriptorSetLayout(g->device, g->set_layout, NULL);
        if (g->pool) vkDestroyCommandPool(g->device, g->pool, NULL);
        vkDestroyDevice(g->device, NULL);
    }
    if (g->messenger) {
        PFN_vkDestroyDebugUtilsMessengerEXT destroy =
            (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(g->instance, "vkDestroyDebugUtilsMessengerEXT");
        if (destroy) destroy(g->instance, g->messenger, NULL);
    }
    if (g->instance) vkDestroyInstance(g->instance, NULL);
    free(g);
}

/* A pipeline of the shader `code`, specialized with the kind of a product's weights (constant 0;
 * other shaders have none) and whether the device's fma rounds once (constant 1: exact_math.glsl's
 * NATIVE_FMA, where the shader includes it). */
static quill_status make_pipeline_of(quill_gpu *g, const uint32_t *code, size_t bytes, uint32_t kind, VkPipeline *out,
                                     quill_error *err) {
    const uint32_t values[2] = {kind, g->native_fma ? VK_TRUE : VK_FALSE};
    const VkSpecializationMapEntry entries[2] = {{.constantID = 0, .offset = 0, .size = sizeof(uint32_t)},
                                                 {.constantID = 1, .offset = sizeof(uint32_t), .size = sizeof(uint32_t)}};
    const VkSpecializationInfo specialization = {.mapEntryCount = 2, .pMapEntries = entries, .dataSize = sizeof values,
                                                 .pData = values};
    const VkSpecializationInfo *spec = &specialization;
    const VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = bytes, .pCode = code};
    VkShaderModule module;
    VkResult r = vkCreateShaderModule(g->device, &mi, NULL, &module);
    if (r != VK_SUCCESS) return vk_fail(err, r, "vkCreateShaderModule");
    const VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = module, .pName = "main", .pSpecializationInfo = spec},
        .layout = g->pipe_layout};
    r = vkCreateComputePipelines(g->device, VK_NULL_HANDLE, 1, &ci, NULL, out);
    vkDestroyShaderModule(g->device, module, NULL);
    return r == VK_SUCCESS ? QUILL_OK : vk_fail(err, r, "vkCreateComputePipelines");
}

static quill_status make_pipeline(quill_gpu *g, const uint32_t *code, size_t bytes, VkPipeline *out, quill_error *err) {
    return make_pipeline_of(g, code, bytes, 0, out, err);
}

/* Whether the products of weights of `type` with n_tok tokens (a matrix's: not the experts') run in
 * product_tiled.comp's tiles: a prompt's, where one invocation per (row, token) would read each row
 * and each token's codes once per output. A few tokens take the split way (product_exact.comp:
 * eight invocations per (row, token)), or on a CPU driver one invocation per (row, token). */
static bool tiled_product(const quill_gpu *g, uint32_t type, int n_tok) {
    const int kind = exact_kind(type);
    return g->tiled && kind >= 0 && kind < TILED_KINDS && n_tok > SPLIT_MAX_TOKENS;
}

/* Workgroups of a product of n (row, token) pairs that is not tiled: the split way's (SPLIT_PAIRS
 * pairs a workgroup for the exact products, one for the float ones), or an invocation a pair. */
static uint64_t split_groups(bool exact, bool split, uint64_t pairs) {
    if (!split) return (pairs + WORKGROUP - 1) / WORKGROUP;
    return exact ? (pairs + SPLIT_PAIRS - 1) / SPLIT_PAIRS : pairs;
}

/* Workgroups of a tiled product (product_tiled.comp numbers them row tile first). */
static uint64_t tiles(int64_t rows, int n_tok) {
    return (uint64_t)((rows + TILE - 1) / TILE) * (uint64_t)((n_tok + TILE - 1) / TILE);
}

/* *pipe: the pipeline index of the products of weights of `type` (tiled: product_tiled.comp's), made
 * at its first use. */
static quill_status product_pipe(quill_gpu *g, uint32_t type, bool tiled, int *pipe, quill_error *err) {
    const bool exact = exact_kind(type) >= 0;
    const int kind = exact ? exact_kind(type) : float_kind(type);
    *pipe = (tiled ? PIPE_TILED_FIRST : exact ? PIPE_EXACT_FIRST : PIPE_FLOAT_FIRST) + kind;
    if (g->pipes[*pipe]) return QUILL_OK;
    const uint32_t k = (uint32_t)kind;
    if (tiled) return make_pipeline_of(g, spv_product_tiled, sizeof spv_product_tiled, k, &g->pipes[*pipe], err);
    return exact ? make_pipeline_of(g, spv_product_exact, sizeof spv_product_exact, k, &g->pipes[*pipe], err)
                 : make_pipeline_of(g, spv_product_float, sizeof spv_product_float, k, &g->pipes[*pipe], err);
}

static quill_status open_device(quill_gpu *g, int index, quill_error *err) {
    quill_status s = make_instance(g, &g->instance, err);
    if (s) return s;
    VkPhysicalDevice *phys;
    uint32_t count;
    if ((s = physical_devices(g->instance, &phys, &count, err))) return s;
    if (count == 0 || index < 0 || (uint32_t)index >= count) {
        free(phys);
        if (!count)
            return quill_fail(err, QUILL_E_UNSUPPORTED,
                              "vulkan: no Vulkan device found (install mesa-vulkan-drivers for lavapipe, or your GPU's driver)");
        return quill_fail(err, QUILL_E_ARG, "vulkan: --device %d: there are %u devices, 0 to %u (quill devices lists them)",
                          index, count, count - 1);
    }
    g->phys = phys[index];
    free(phys);
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(g->phys, &props);
    snprintf(g->name, sizeof g->name, "%s", props.deviceName);
    g->offset_alignment = props.limits.minStorageBufferOffsetAlignment ? (size_t)props.limits.minStorageBufferOffsetAlignment : 4;
    /* a CPU driver runs a workgroup's invocations as one thread's vector lanes: the split way's
     * one-invocation tail and barrier only cost there (lavapipe: the products test 24x slower) */
    g->cpu_device = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    g->split = !g->cpu_device;
    /* (a device may offer as little as 16 KiB of shared memory and 128 invocations a workgroup) */
    g->tiled = props.limits.maxComputeSharedMemorySize >= TILED_SHARED_BYTES &&
               props.limits.maxComputeWorkGroupInvocations >= TILED_WORKGROUP &&
               props.limits.maxComputeWorkGroupSize[0] >= TILED_WORKGROUP;
    g->dispatch_width = 65535;
    g->attention_kept = ATTENTION_KEPT;
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(g->phys, &nq, NULL);
    VkQueueFamilyProperties qf[16];
    if (nq > 16) nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(g->phys, &nq, qf);
    g->queue_family = UINT32_MAX;
    for (uint32_t i = 0; i < nq && g->queue_family == UINT32_MAX; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) g->queue_family = i;
    if (g->queue_family == UINT32_MAX)
        return quill_fail(err, QUILL_E_UNSUPPORTED, "vulkan: device %d has no compute queue", index);
    VkPhysicalDeviceMemoryProperties mem;
    vkGetPhysicalDeviceMemoryProperties(g->phys, &mem);
    const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    /* the host's buffers: cached memory where there is some (the host reads the results back: from
     * write-combined memory that is slow), and the host's own rather than a GPU's small window of
     * its memory (the 256 MiB BAR without resizable BAR) */
    g->host_memory_type = g->device_memory_type = UINT32_MAX;
    int best = -1;
    for (uint32_t i = 0; i < mem.memoryTypeCount; i++) {
        const VkMemoryPropertyFlags f = mem.memoryTypes[i].propertyFlags;
        const int score = 2 * !!(f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT) + !(f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
        if ((f & want) == want && score > best) g->host_memory_type = i, best = score;
        if (g->device_memory_type == UINT32_MAX && (f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) g->device_memory_type = i;
    }
    if (g->host_memory_type == UINT32_MAX)
        return quill_fail(err, QUILL_E_UNSUPPORTED, "vulkan: device %d has no host-visible coherent memory", index);
    if (g->device_memory_type == UINT32_MAX) g->device_memory_type = g->host_memory_type;
    g->device_memory_mapped = (mem.memoryTypes[g->device_memory_type].propertyFlags & want) == want;
    g->staging_chunk = (size_t)64 << 20;
    for (uint32_t i = 0; i < mem.memoryHeapCount; i++)
        if (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) g->memory += mem.memoryHeaps[i].size;
    /* a cap on what quill takes, leaving the rest to other programs */
    const char *cap = getenv("QUILL_VULKAN_MEMORY_MIB");
    char *end;
    const unsigned long long mib = cap && *cap ? strtoull(cap, &end, 10) : 0;
    if (cap && *cap && (*end || mib == 0))
        return quill_fail(err, QUILL_E_ARG, "vulkan: QUILL_VULKAN_MEMORY_MIB=%s is not a positive whole number of MiB", cap);
    if (mib && (mib << 20) < g->memory) g->memory = mib << 20;

    const float priority = 1.0f;
    const VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                        .queueFamilyIndex = g->queue_family, .queueCount = 1, .pQueuePriorities = &priority};
    /* the exact products round their multiply-adds once through float64 (product_exact.comp) */
    VkPhysicalDeviceFeatures have;
    vkGetPhysicalDeviceFeatures(g->phys, &have);
    if (!have.shaderFloat64)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "vulkan: device %d lacks shaderFloat64, which quill's exact products need (docs/gpu.md)", index);
    const VkPhysicalDeviceFeatures enable = {.shaderFloat64 = VK_TRUE};
    const VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1,
                                   .pQueueCreateInfos = &qi, .pEnabledFeatures = &enable};
    VkResult r = vkCreateDevice(g->phys, &di, NULL, &g->device);
    if (r != VK_SUCCESS) return vk_fail(err, r, "vkCreateDevice");
    vkGetDeviceQueue(g->device, g->queue_family, 0, &g->queue);
    const VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                        .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                        .queueFamilyIndex = g->queue_family};
    if ((r = vkCreateCommandPool(g->device, &pi, NULL, &g->pool)) != VK_SUCCESS) return vk_fail(err, r, "vkCreateCommandPool");
    VkDescriptorSetLayoutBinding b[BINDINGS];
    for (uint32_t i = 0; i < BINDINGS; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = i, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1, .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    const VkDescriptorSetLayoutCreateInfo li = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                                .bindingCount = BINDINGS, .pBindings = b};
    if ((r = vkCreateDescriptorSetLayout(g->device, &li, NULL, &g->set_layout)) != VK_SUCCESS)
        return vk_fail(err, r, "vkCreateDescriptorSetLayout");
    const VkPushConstantRange push = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .size = PUSH_WORDS * sizeof(uint32_t)};
    const VkPipelineLayoutCreateInfo pl = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, .setLayoutCount = 1,
                                           .pSetLayouts = &g->set_layout, .pushConstantRangeCount = 1,
                                           .pPushConstantRanges = &push};
    if ((r = vkCreatePipelineLayout(g->device, &pl, NULL, &g->pipe_layout)) != VK_SUCCESS)
        return vk_fail(err, r, "vkCreatePipelineLayout");
    /* the descriptor sets of a group of products (the quantizer's, each product's), the command
     * buffer and the fence */
    enum { SETS = 1 + QUILL_GPU_GROUP_MAX };
    const VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, SETS * BINDINGS};
    const VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = SETS,
                                            .poolSizeCount = 1, .pPoolSizes = &ps};
    if ((r = vkCreateDescriptorPool(g->device, &dpi, NULL, &g->dpool)) != VK_SUCCESS) return vk_fail(err, r, "vkCreateDescriptorPool");
    VkDescriptorSetLayout layouts[SETS];
    for (int i = 0; i < SETS; i++) layouts[i] = g->set_layout;
    const VkDescriptorSetAllocateInfo dai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, .descriptorPool = g->dpool,
                                             .descriptorSetCount = SETS, .pSetLayouts = layouts};
    if ((r = vkAllocateDescriptorSets(g->device, &dai, g->sets)) != VK_SUCCESS) return vk_fail(err, r, "vkAllocateDescriptorSets");
    const VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = g->pool,
                                             .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    if ((r = vkAllocateCommandBuffers(g->device, &cai, &g->cmd)) != VK_SUCCESS ||
        (r = vkAllocateCommandBuffers(g->device, &cai, &g->step_cmd)) != VK_SUCCESS)
        return vk_fail(err, r, "vkAllocateCommandBuffers");
    const VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if ((r = vkCreateFence(g->device, &fi, NULL, &g->fence)) != VK_SUCCESS) return vk_fail(err, r, "vkCreateFence");
    const VkDescriptorPoolSize cps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, SET_CACHE_MAX * BINDINGS};
    const VkDescriptorPoolCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = SET_CACHE_MAX,
                                            .poolSizeCount = 1, .pPoolSizes = &cps};
    if ((r = vkCreateDescriptorPool(g->device, &cpi, NULL, &g->cache_pool)) != VK_SUCCESS)
        return vk_fail(err, r, "vkCreateDescriptorPool");
    if (!(g->set_cache = calloc(SET_CACHE_SLOTS, sizeof *g->set_cache))) return quill_fail(err, QUILL_E_NOMEM, "vulkan: out of memory");
    /* QUILL_VULKAN_SET_CACHE=N keeps at most N sets (the tests fill it) */
    const char *sets = getenv("QUILL_VULKAN_SET_CACHE");
    g->set_cache_max = sets && atoi(sets) > 0 && atoi(sets) < SET_CACHE_MAX ? atoi(sets) : SET_CACHE_MAX;
    const char *profile = getenv("QUILL_VULKAN_PROFILE");
    if (profile && !strcmp(profile, "1") && props.limits.timestampComputeAndGraphics && qf[g->queue_family].timestampValidBits) {
        if (!(g->profile = calloc(1, sizeof *g->profile))) return quill_fail(err, QUILL_E_NOMEM, "vulkan: out of memory");
        g->profile->period_ns = props.limits.timestampPeriod;
        const VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                          .queryCount = PROFILE_QUERIES};
        if ((r = vkCreateQueryPool(g->device, &qi, NULL, &g->profile->pool)) != VK_SUCCESS) return vk_fail(err, r, "vkCreateQueryPool");
    }
    return QUILL_OK;
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* A timestamp of the profile after the commands recorded so far, labelled (see gpu_profile). */
static void profile_mark(quill_gpu *g, VkCommandBuffer cmd, int label) {
    gpu_profile *pr = g->profile;
    if (!pr) return;
    if (pr->used >= PROFILE_QUERIES) {
        pr->dropped++;
        return;
    }
    pr->label[pr->used] = (uint16_t)label;
    vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pr->pool, pr->used++);
}

/* The step's timestamps into the sums (after the step ran). */
static void profile_collect(quill_gpu *g) {
    gpu_profile *pr = g->profile;
    if (!pr || pr->used < 2) return;
    if (vkGetQueryPoolResults(g->device, pr->pool, 0, pr->used, sizeof pr->ticks, pr->ticks, sizeof pr->ticks[0],
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
        return;
    for (uint32_t i = 1; i < pr->used; i++) {
        pr->ns[pr->label[i]] += (double)(pr->ticks[i] - pr->ticks[i - 1]) * pr->period_ns;
        pr->calls[pr->label[i]]++;
    }
    pr->steps++;
}

static const char *const fixed_pipe_names[PIPE_EXACT_FIRST] = {
    "quantize", "rmsnorm", "rope", "kv_store", "attention", "glu", "add_rows", "scale", "route_logits", "route_select",
    "moe_sum"};

static void profile_label_name(int label, char *out, size_t n) {
    const int pipe = label % PIPE_COUNT;
    const char *way = label >= PIPE_COUNT ? " (split)" : "";
    if (label == 2 * PIPE_COUNT) snprintf(out, n, "copy");
    else if (pipe < PIPE_EXACT_FIRST) snprintf(out, n, "%s", fixed_pipe_names[pipe]);
    else if (pipe < PIPE_FLOAT_FIRST) snprintf(out, n, "product_exact %d%s", pipe - PIPE_EXACT_FIRST, way);
    else if (pipe < PIPE_TILED_FIRST) snprintf(out, n, "product_float %d%s", pipe - PIPE_FLOAT_FIRST, way);
    else snprintf(out, n, "product_tiled %d", pipe - PIPE_TILED_FIRST);
}

/* The sums through the library's log (info), the largest first. */
static void profile_report(const quill_gpu *g) {
    const gpu_profile *pr = g->profile;
    if (!pr->steps) return;
    double total = 0;
    for (int i = 0; i < PROFILE_LABELS; i++) total += pr->ns[i];
    quill_log(QUILL_LOG_INFO,
              "vulkan profile: %llu steps (%llu of them the step before's commands again), %.3f ms on the device "
              "(%.3f a step), the host %.3f ms recording and %.3f ms waiting (a step: %.3f, %.3f)%s",
              (unsigned long long)pr->steps, (unsigned long long)g->replays, total * 1e-6, total * 1e-6 / (double)pr->steps, pr->record_ns * 1e-6,
              pr->wait_ns * 1e-6, pr->record_ns * 1e-6 / (double)pr->steps, pr->wait_ns * 1e-6 / (double)pr->steps,
              pr->dropped ? " (some dispatches past the profile's room were not timed)" : "");
    bool done[PROFILE_LABELS] = {false};
    for (;;) {
        int best = -1;
        for (int i = 0; i < PROFILE_LABELS; i++)
            if (!done[i] && pr->calls[i] && (best < 0 || pr->ns[i] > pr->ns[best])) best = i;
        if (best < 0) break;
        done[best] = true;
        char name[64];
        profile_label_name(best, name, sizeof name);
        quill_log(QUILL_LOG_INFO, "vulkan profile: %-26s %8llu calls %10.3f ms %5.1f%% %9.2f us a call", name,
                  (unsigned long long)pr->calls[best], pr->ns[best] * 1e-6, 100.0 * pr->ns[best] / total,
                  pr->ns[best] * 1e-3 / (double)pr->calls[best]);
    }
}

/* ---------------------------------------------------------------- one product */


/* A storage buffer of `bytes` in device-local memory (device_local) or host-visible memory; mapped
 * when its memory is host-visible. */
static quill_status buffer_make(quill_gpu *g, size_t bytes, bool device_local, gpu_buffer *b, quill_error *err) {
    /* (16 bytes of slack: exact_weights.glsl's word2_at may read the word after the last) */
    b->bytes = ((bytes + 3) & ~(size_t)3) + 16;
    const VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = b->bytes,
                                   .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                            VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                   .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = vkCreateBuffer(g->device, &bi, NULL, &b->buf);
    if (r != VK_SUCCESS) return vk_fail(err, r, "vkCreateBuffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(g->device, b->buf, &req);
    const uint32_t type = device_local ? g->device_memory_type : g->host_memory_type;
    if (!(req.memoryTypeBits & (1u << type)))
        return quill_fail(err, QUILL_E_UNSUPPORTED, "vulkan: the device keeps storage buffers out of its %s memory",
                          device_local ? "device-local" : "host-visible");
    const VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size,
                                     .memoryTypeIndex = type};
    if ((r = vkAllocateMemory(g->device, &ai, NULL, &b->mem)) != VK_SUCCESS)
        return r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY
                   ? quill_fail(err, QUILL_E_NOMEM, "vulkan: %zu bytes do not fit the device's memory", b->bytes)
                   : vk_fail(err, r, "vkAllocateMemory");
    if ((r = vkBindBufferMemory(g->device, b->buf, b->mem, 0)) != VK_SUCCESS) return vk_fail(err, r, "vkBindBufferMemory");
    if ((!device_local || g->device_memory_mapped) && (r = vkMapMemory(g->device, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map)) != VK_SUCCESS)
        return vk_fail(err, r, "vkMapMemory");
    return QUILL_OK;
}

static void set_cache_clear(quill_gpu *g) {
    g->replay_ok = false; /* (the kept step's sets, or its buffers, are going) */
    if (!g->set_cache_used) return;
    vkResetDescriptorPool(g->device, g->cache_pool, 0);
    memset(g->set_cache, 0, SET_CACHE_SLOTS * sizeof *g->set_cache);
    g->set_cache_used = 0;
}

static void buffer_free(quill_gpu *g, gpu_buffer *b) {
    if (b->buf) set_cache_clear(g);
    if (b->map) vkUnmapMemory(g->device, b->mem);
    if (b->buf) vkDestroyBuffer(g->device, b->buf, NULL);
    if (b->mem) vkFreeMemory(g->device, b->mem, NULL);
    memset(b, 0, sizeof *b);
}

/* A kept buffer with room for `bytes`: made again, larger, when it has less. */
static quill_status buffer_room(quill_gpu *g, gpu_buffer *b, size_t bytes, bool device_local, quill_error *err) {
    if (b->buf && b->bytes >= bytes) return QUILL_OK;
    buffer_free(g, b);
    const quill_status s = buffer_make(g, bytes, device_local, b, err);
    if (s) buffer_free(g, b);
    return s;
}

/* Submits a recorded command buffer and waits for it. */
static quill_status submit_cmd(quill_gpu *g, VkCommandBuffer cmd, const char *what, quill_error *err) {
    VkResult r;
    const VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cmd};
    if ((r = vkResetFences(g->device, 1, &g->fence)) != VK_SUCCESS || (r = vkQueueSubmit(g->queue, 1, &si, g->fence)) != VK_SUCCESS ||
        (r = vkWaitForFences(g->device, 1, &g->fence, VK_TRUE, UINT64_MAX)) != VK_SUCCESS)
        return vk_fail(err, r, what);
    return QUILL_OK;
}

/* Runs the command buffer as recorded and waits for it. */
static quill_status submit_and_wait(quill_gpu *g, const char *what, quill_error *err) {
    VkResult r = vkEndCommandBuffer(g->cmd);
    if (r != VK_SUCCESS) return vk_fail(err, r, "vkEndCommandBuffer");
    return submit_cmd(g, g->cmd, what, err);
}

static void begin_commands(quill_gpu *g) {
    const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                         .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    vkResetCommandBuffer(g->cmd, 0);
    vkBeginCommandBuffer(g->cmd, &bi);
}

void quill_gpu_set_split(quill_gpu *g, bool split) { g->split = split; }

bool quill_gpu_set_tiled(quill_gpu *g, bool tiled) {
    const bool was = g->tiled;
    g->tiled = tiled;
    return was;
}

void quill_gpu_set_dispatch_width(quill_gpu *g, uint32_t width) { g->dispatch_width = width ? width : 1; }

void quill_gpu_set_attention_kept(quill_gpu *g, uint32_t n) { g->attention_kept = n < ATTENTION_KEPT ? n : ATTENTION_KEPT; }

void quill_gpu_force_staging(quill_gpu *g, size_t chunk) {
    g->device_memory_mapped = false;
    g->staging_chunk = chunk < 4 ? 4 : chunk & ~(size_t)3;
}

/* Copies host bytes into a device-local buffer that the host cannot map, through a staging buffer
 * of at most staging_chunk bytes (64 MiB: a large weight does not need its size twice in host
 * memory). */
static quill_status upload_staged(quill_gpu *g, const void *host, size_t bytes, const gpu_buffer *dst, quill_error *err) {
    gpu_buffer staging = {0};
    const size_t chunk = bytes < g->staging_chunk ? bytes : g->staging_chunk;
    quill_status s = buffer_make(g, chunk, false, &staging, err);
    for (size_t at = 0; !s && at < bytes; at += chunk) {
        const size_t n = bytes - at < chunk ? bytes - at : chunk;
        memcpy(staging.map, (const char *)host + at, n);
        begin_commands(g);
        const VkBufferCopy copy = {.srcOffset = 0, .dstOffset = at, .size = (n + 3) & ~(size_t)3};
        vkCmdCopyBuffer(g->cmd, staging.buf, dst->buf, 1, &copy);
        const VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                                    .dstAccessMask = VK_ACCESS_SHADER_READ_BIT};
        vkCmdPipelineBarrier(g->cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0,
                             NULL);
        s = submit_and_wait(g, "uploading weights", err);
    }
    buffer_free(g, &staging);
    return s;
}

/* A device-local buffer *b holding a copy of host's bytes (mapped, or through the staging buffer);
 * nothing on failure. */
static quill_status device_copy(quill_gpu *g, const void *host, size_t bytes, gpu_buffer *b, quill_error *err) {
    quill_status s = buffer_make(g, bytes, true, b, err);
    if (!s) {
        if (b->map) memcpy(b->map, host, bytes);
        else s = upload_staged(g, host, bytes, b, err);
    }
    if (s) buffer_free(g, b);
    return s;
}

/* The grid i-quants' lattice tables into device memory, one after another at product_exact.comp's
 * GRID_* offsets (a 64-bit entry as two words, low first). */
static quill_status upload_grids(quill_gpu *g, quill_error *err) {
    enum { WORDS = 2 * 256 + 2 * 512 + 2 * 1024 + 256 + 512 + 2 * 2048 };
    uint32_t *t = malloc(WORDS * sizeof *t);
    if (!t) return quill_fail(err, QUILL_E_NOMEM, "vulkan: out of memory");
    uint32_t *at = t;
    const struct {
        const uint64_t *grid;
        int n;
    } wide[] = {{quill_iq2xxs_grid, 256}, {quill_iq2xs_grid, 512}, {quill_iq2s_grid, 1024}};
    for (size_t k = 0; k < sizeof wide / sizeof wide[0]; k++)
        for (int i = 0; i < wide[k].n; i++) *at++ = (uint32_t)wide[k].grid[i], *at++ = (uint32_t)(wide[k].grid[i] >> 32);
    memcpy(at, quill_iq3xxs_grid, 256 * sizeof *at), at += 256;
    memcpy(at, quill_iq3s_grid, 512 * sizeof *at), at += 512;
    for (int i = 0; i < 2048; i++) *at++ = (uint32_t)quill_iq1s_grid[i], *at++ = (uint32_t)(quill_iq1s_grid[i] >> 32);
    const quill_status s = device_copy(g, t, WORDS * sizeof *t, &g->grids, err);
    free(t);
    return s;
}

static quill_status probe_fma(quill_gpu *g, quill_error *err);

/* The pipelines of the shaders other than the products' (those are made at their first use). */
static quill_status make_fixed_pipelines(quill_gpu *g, quill_error *err) {
    quill_status s;
    if ((s = make_pipeline(g, spv_quantize, sizeof spv_quantize, &g->pipes[PIPE_QUANTIZE], err))) return s;
    if ((s = make_pipeline(g, spv_rmsnorm, sizeof spv_rmsnorm, &g->pipes[PIPE_RMSNORM], err))) return s;
    if ((s = make_pipeline(g, spv_rope, sizeof spv_rope, &g->pipes[PIPE_ROPE], err))) return s;
    if ((s = make_pipeline(g, spv_kv_store, sizeof spv_kv_store, &g->pipes[PIPE_KV_STORE], err))) return s;
    if ((s = make_pipeline(g, spv_attention, sizeof spv_attention, &g->pipes[PIPE_ATTENTION], err))) return s;
    if ((s = make_pipeline(g, spv_glu, sizeof spv_glu, &g->pipes[PIPE_GLU], err))) return s;
    if ((s = make_pipeline(g, spv_add_rows, sizeof spv_add_rows, &g->pipes[PIPE_ADD_ROWS], err))) return s;
    if ((s = make_pipeline(g, spv_scale, sizeof spv_scale, &g->pipes[PIPE_SCALE], err))) return s;
    if ((s = make_pipeline(g, spv_route_logits, sizeof spv_route_logits, &g->pipes[PIPE_ROUTE_LOGITS], err))) return s;
    if ((s = make_pipeline(g, spv_route_select, sizeof spv_route_select, &g->pipes[PIPE_ROUTE_SELECT], err))) return s;
    if ((s = make_pipeline(g, spv_moe_sum, sizeof spv_moe_sum, &g->pipes[PIPE_MOE_SUM], err))) return s;
    return QUILL_OK;
}

quill_status quill_gpu_open(int index, quill_gpu **out, quill_error *err) {
    *out = NULL;
    quill_gpu *g = calloc(1, sizeof *g);
    if (!g) return quill_fail(err, QUILL_E_NOMEM, "vulkan: out of memory");
    quill_status s = open_device(g, index, err);
    if (!s) s = probe_fma(g, err);
    if (!s) s = make_fixed_pipelines(g, err);
    if (!s) s = upload_grids(g, err);
    if (s) {
        quill_gpu_close(g);
        return s;
    }
    *out = g;
    return QUILL_OK;
}

static const gpu_buffer *resident_of(const quill_gpu *g, const void *host, size_t bytes) {
    for (int i = 0; i < g->n_resident; i++)
        if (g->resident[i].host == host && g->resident[i].buf.bytes >= bytes) return &g->resident[i].buf;
    return NULL;
}

bool quill_gpu_resident(const quill_gpu *g, const void *w) { return g && resident_of(g, w, 0); }

quill_status quill_gpu_upload(quill_gpu *g, const void *w, size_t bytes, quill_error *err) {
    if (resident_of(g, w, bytes)) return QUILL_OK;
    if (g->n_resident == g->cap_resident) {
        const int cap = g->cap_resident ? 2 * g->cap_resident : 64;
        struct resident *r = realloc(g->resident, (size_t)cap * sizeof *r);
        if (!r) return quill_fail(err, QUILL_E_NOMEM, "vulkan: out of memory");
        g->resident = r, g->cap_resident = cap;
    }
    struct resident *r = &g->resident[g->n_resident];
    memset(r, 0, sizeof *r);
    const quill_status s = device_copy(g, w, bytes, &r->buf, err);
    if (s) return s;
    r->host = w;
    g->n_resident++;
    return QUILL_OK;
}

/* A descriptor set of the buffers (NULL ones: the first again), the results' (binding 3) from
 * y_offset bytes on. */
static void bind_set(quill_gpu *g, VkDescriptorSet set, const gpu_buffer *const bufs[BINDINGS], size_t y_offset) {
    VkDescriptorBufferInfo info[BINDINGS];
    VkWriteDescriptorSet w[BINDINGS];
    for (int i = 0; i < BINDINGS; i++) {
        const gpu_buffer *b = bufs[i] ? bufs[i] : bufs[0];
        info[i] = (VkDescriptorBufferInfo){b->buf, i == 3 ? y_offset : 0, VK_WHOLE_SIZE};
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set, .dstBinding = (uint32_t)i,
                                      .descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                      .pBufferInfo = &info[i]};
    }
    vkUpdateDescriptorSets(g->device, BINDINGS, w, 0, NULL);
}

static uint64_t groups(uint64_t n) { return (n + WORKGROUP - 1) / WORKGROUP; }

/* Learns whether the device's GLSL fma rounds once (g->native_fma), from triples whose product and
 * sum rounded apart give another float than rounded once: products near the sum's negation, whose
 * low bits a separate rounding loses, across exponents, signs and the halfway cases. Every one must
 * equal C's fmaf: a device that fuses only sometimes keeps the float64 steps. QUILL_VULKAN_FMA=float64
 * keeps them anyway (to measure what the native fma saves). */
static quill_status probe_fma(quill_gpu *g, quill_error *err) {
    g->native_fma = false;
    const char *force = getenv("QUILL_VULKAN_FMA");
    if (force && !strcmp(force, "float64")) {
        quill_log(QUILL_LOG_INFO, "vulkan: %s: the exact products' multiply-adds take float64 steps (QUILL_VULKAN_FMA=float64)",
                  g->name);
        return QUILL_OK;
    }
    enum { N = 1024 };
    quill_status s;
    if ((s = buffer_room(g, &g->x, 3 * N * sizeof(float), false, err)) || (s = buffer_room(g, &g->y, N * sizeof(float), false, err)))
        return s;
    float *x = g->x.map;
    uint64_t state = 0x243F6A8885A308D3ull;
    for (int i = 0; i < N; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t bits = (uint32_t)(state >> 32);
        /* a and b in [1, 2) with random low bits, scaled by 2^(-20..20); c the negated product
         * rounded, nudged by a few units: the fused and unfused results differ in most */
        const float a = ldexpf(1.0f + (float)(bits & 0xFFFFF) * 0x1p-20f, (int)(bits >> 27) - 16);
        const float b = ldexpf(1.0f + (float)((bits >> 8) & 0xFFFFF) * 0x1p-20f + 0x1p-23f, (int)((bits >> 3) & 15) - 8);
        float c = -(a * b);
        for (uint32_t k = 0; k < (bits & 3); k++) c = nextafterf(c, (bits & 4) ? INFINITY : -INFINITY);
        if (i % 2) c = ldexpf(c, (int)(bits % 5) - 2); /* (sums that do not cancel, too) */
        x[3 * i] = i % 3 ? a : -a, x[3 * i + 1] = b, x[3 * i + 2] = i % 3 ? c : -c;
    }
    VkPipeline pipe;
    if ((s = make_pipeline(g, spv_fma_probe, sizeof spv_fma_probe, &pipe, err))) return s;
    bind_set(g, g->sets[0], (const gpu_buffer *const[BINDINGS]){&g->x, NULL, NULL, &g->y}, 0);
    begin_commands(g);
    const uint32_t n = N;
    vkCmdBindPipeline(g->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    vkCmdBindDescriptorSets(g->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->pipe_layout, 0, 1, &g->sets[0], 0, NULL);
    vkCmdPushConstants(g->cmd, g->pipe_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof n, &n);
    vkCmdDispatch(g->cmd, N / WORKGROUP, 1, 1);
    const VkMemoryBarrier hb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                                .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    vkCmdPipelineBarrier(g->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &hb, 0, NULL, 0, NULL);
    s = submit_and_wait(g, "probing the device's fma", err);
    vkDestroyPipeline(g->device, pipe, NULL);
    if (s) return s;
    const float *y = g->y.map;
    bool fused = true;
    for (int i = 0; i < N && fused; i++) {
        const float want = fmaf(x[3 * i], x[3 * i + 1], x[3 * i + 2]);
        fused = !memcmp(&want, &y[i], sizeof want);
    }
    g->native_fma = fused;
    /* (a GPU whose fma rounds twice runs every exact product several times slower: worth a warning) */
    if (fused)
        quill_log(QUILL_LOG_INFO, "vulkan: %s: the exact products' multiply-adds take its fma (it rounds once, as C's fmaf)",
                  g->name);
    else
        quill_log(g->cpu_device ? QUILL_LOG_INFO : QUILL_LOG_WARN,
                  "vulkan: %s: its fma does not round once as C's fmaf, so the exact products' multiply-adds take "
                  "float64 steps (the same bits, slower)",
                  g->name);
    return QUILL_OK;
}

bool quill_gpu_native_fma(const quill_gpu *g) { return g->native_fma; }

/* n workgroups, over x and y where they outnumber the 65535 a device must take in x (the shaders
 * number them y · width + x, and skip those past their work). */
static void dispatch(const quill_gpu *g, VkCommandBuffer cmd, uint64_t n) {
    const uint32_t x = n < g->dispatch_width ? (uint32_t)(n ? n : 1) : g->dispatch_width;
    vkCmdDispatch(cmd, x, (uint32_t)((n + x - 1) / x), 1);
}


/* Whether one product's arguments are in range (the shaders index in 32 bits). */
static quill_status check_product(const quill_gpu_mat *p, int64_t cols, int n_tok, quill_error *err) {
    if (!quill_gpu_supports(p->type))
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "vulkan: weights of type %s have no GPU product yet (" QUILL_GPU_TYPES " do)",
                          quill_type_name(p->type));
    const bool exact = exact_kind(p->type) >= 0;
    /* (the activations' codes come in blocks of 32; f16 and bf16 are read in pairs) */
    const int64_t block = quill_type_traits_of(p->type)->block_size;
    if (p->rows <= 0 || cols <= 0 || n_tok <= 0 || cols % block || cols % (exact ? 32 : 2) ||
        p->row_bytes != quill_row_size(p->type, cols) || (uint64_t)p->rows * (uint64_t)n_tok > UINT32_MAX / 2 ||
        (uint64_t)p->rows * p->row_bytes > UINT32_MAX / 2 || (uint64_t)cols * (uint64_t)n_tok > UINT32_MAX / 2)
        return quill_fail(err, QUILL_E_ARG, "vulkan: a product of %lld x %lld %s weights with %d tokens is out of range",
                          (long long)p->rows, (long long)cols, quill_type_name(p->type), n_tok);
    return QUILL_OK;
}

static size_t aligned(size_t n, size_t a) { return (n + a - 1) / a * a; }

quill_status quill_gpu_matmuls(quill_gpu *g, const quill_gpu_mat *p, int n, int64_t cols, const float *x, int n_tok,
                               quill_error *err) {
    if (n < 1 || n > QUILL_GPU_GROUP_MAX)
        return quill_fail(err, QUILL_E_ARG, "vulkan: %d products in one group (1 to %d)", n, QUILL_GPU_GROUP_MAX);
    if (g->stepping) return quill_fail(err, QUILL_E_ARG, "vulkan: a product called while a step is being recorded");
    quill_status s;
    const size_t xs = (size_t)cols * (size_t)n_tok;
    const gpu_buffer *weights[QUILL_GPU_GROUP_MAX];
    size_t y_at[QUILL_GPU_GROUP_MAX + 1] = {0};
    bool any_exact = false;
    int pipes[QUILL_GPU_GROUP_MAX];
    for (int i = 0; i < n; i++) {
        if ((s = check_product(&p[i], cols, n_tok, err)) ||
            (s = product_pipe(g, p[i].type, tiled_product(g, p[i].type, n_tok), &pipes[i], err)))
            return s;
        any_exact |= exact_kind(p[i].type) >= 0;
        weights[i] = resident_of(g, p[i].w, (size_t)p[i].rows * p[i].row_bytes);
        if (!weights[i] && n > 1)
            return quill_fail(err, QUILL_E_ARG, "vulkan: the weights of a group of products must be uploaded first");
        /* each product's results at an offset the device's storage descriptors accept */
        y_at[i + 1] = aligned(y_at[i] + (size_t)p[i].rows * (size_t)n_tok * sizeof(float), g->offset_alignment);
    }
    /* the weights: uploaded once (quill_gpu_upload), or for this call in the kept host-visible buffer */
    if ((!weights[0] && (s = buffer_room(g, &g->w, (size_t)p[0].rows * p[0].row_bytes, false, err))) ||
        (s = buffer_room(g, &g->x, xs * sizeof(float), false, err)) ||
        (s = buffer_room(g, &g->codes, any_exact ? xs * sizeof(int32_t) : 4, true, err)) ||
        (s = buffer_room(g, &g->da, any_exact ? xs / 32 * sizeof(float) : 4, true, err)) ||
        (s = buffer_room(g, &g->y, y_at[n], false, err)))
        return s;
    if (!weights[0]) {
        memcpy(g->w.map, p[0].w, (size_t)p[0].rows * p[0].row_bytes);
        weights[0] = &g->w;
    }
    memcpy(g->x.map, x, xs * sizeof(float));
    /* the quantizer reads x and writes the codes and scales; an exact product reads those, a float
     * product x (its binding 1) */
    bind_set(g, g->sets[0], (const gpu_buffer *const[BINDINGS]){&g->x, &g->codes, &g->da, &g->y}, 0);
    for (int i = 0; i < n; i++)
        bind_set(g, g->sets[1 + i],
                 exact_kind(p[i].type) >= 0
                     ? (const gpu_buffer *const[BINDINGS]){weights[i], &g->codes, &g->da, &g->y, NULL, &g->grids}
                     : (const gpu_buffer *const[BINDINGS]){weights[i], &g->x, &g->da, &g->y},
                 y_at[i]);

    begin_commands(g);
    VkCommandBuffer cmd = g->cmd;
    const VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                .srcAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT,
                                .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
    int quantized_for = -1; /* the act_max of the codes in the codes buffer */
    for (int i = 0; i < n; i++) {
        const bool exact = exact_kind(p[i].type) >= 0;
        /* the codes once for the group, again where a type wants another act_max (after the
         * products that read the earlier ones) */
        if (exact && act_max(p[i].type) != quantized_for) {
            if (quantized_for >= 0)
                vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb,
                                     0, NULL, 0, NULL);
            quantized_for = act_max(p[i].type);
            const uint32_t qp[2] = {(uint32_t)(xs / 32), (uint32_t)quantized_for};
            vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->pipes[PIPE_QUANTIZE]);
            vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->pipe_layout, 0, 1, &g->sets[0], 0, NULL);
            vkCmdPushConstants(cmd, g->pipe_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof qp, qp);
            dispatch(g, cmd, (xs / 32 + 1) / 2); /* (quantize.comp: two blocks a workgroup) */
            vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0,
                                 NULL, 0, NULL);
        }
        /* a few tokens: a workgroup per (row, token), else the rows alone are too few for a GPU
         * (the bits are the same either way) */
        const int64_t parts = exact ? cols / slot_width(p[i].type) : (cols + 31) / 32;
        const bool split = g->split && n_tok <= SPLIT_MAX_TOKENS && (exact || parts <= SPLIT_MAX_PARTS);
        const uint32_t pp[8] = {(uint32_t)p[i].rows, (uint32_t)cols, (uint32_t)n_tok, (uint32_t)p[i].row_bytes,
                                (uint32_t)(exact ? exact_kind(p[i].type) : float_kind(p[i].type)), split, 0, 0};
        vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->pipes[pipes[i]]);
        vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->pipe_layout, 0, 1, &g->sets[1 + i], 0, NULL);
        vkCmdPushConstants(cmd, g->pipe_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pp, pp);
        const uint64_t pairs = (uint64_t)p[i].rows * (uint64_t)n_tok;
        dispatch(g, cmd, tiled_product(g, p[i].type, n_tok) ? tiles(p[i].rows, n_tok) : split_groups(exact, split, pairs));
    }
    const VkMemoryBarrier hb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                                .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &hb, 0, NULL, 0, NULL);
    if ((s = submit_and_wait(g, "running the products", err))) return s;
    for (int i = 0; i < n; i++)
        memcpy(p[i].y, (const char *)g->y.map + y_at[i], (size_t)p[i].rows * (size_t)n_tok * sizeof(float));
    return QUILL_OK;
}

quill_status quill_gpu_matmul(quill_gpu *g, uint32_t type, const void *w, size_t row_bytes, int64_t rows,
                              int64_t cols, const float *x, int n_tok, float *y, quill_error *err) {
    const quill_gpu_mat p = {type, w, row_bytes, rows, y, 1};
    return quill_gpu_matmuls(g, &p, 1, cols, x, n_tok, err);
}

/* ---------------------------------------------------------------- a step (gpu.h) */

static void step_fail(quill_gpu *g, quill_status s, const char *what) {
    if (g->step_status) return;
    g->step_status = quill_fail(&g->step_err, s, "vulkan: %s", what);
}

/* Floats the shaders index in 32 bits: buffers past this are refused. */
#define SHADER_FLOATS ((uint64_t)UINT32_MAX / 2)

/* kv_types.glsl's type codes */
static int kv_kind(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_F32: return 0;
    case QUILL_TYPE_F16: return 1;
    case QUILL_TYPE_BF16: return 2;
    case QUILL_TYPE_NVFP4: return 3;
    case QUILL_TYPE_Q8_0: return 3;
    case QUILL_TYPE_Q4_0: return 4;
    default: return -1;
    }
}

bool quill_gpu_kv_type_ok(uint32_t type, int64_t hd) {
    const int kind = kv_kind(type);
    return hd > 0 && (kind == 0 || ((kind == 1 || kind == 2) && hd % 2 == 0) || (kind >= 3 && hd % 32 == 0));
}

uint64_t quill_gpu_kv_row_words(uint32_t type, int64_t hd) {
    const uint64_t n = (uint64_t)hd;
    switch (kv_kind(type)) {
    case 0: return n;
    case 1:
    case 2: return n / 2;
    case 3: return n / 4 + n / 32; /* the codes' bytes, then each block's scale */
    default: return n / 8 + n / 32;
    }
}

quill_status quill_gpu_kv_alloc(quill_gpu *g, uint64_t words, quill_error *err) {
    if (words > SHADER_FLOATS)
        return quill_fail(err, QUILL_E_NOMEM,
                          "vulkan: a KV cache of %llu words is more than the shaders index (%llu); use a shorter context "
                          "(-c), fewer sequences or a smaller cache type (-ctk/-ctv)",
                          (unsigned long long)words, (unsigned long long)SHADER_FLOATS);
    quill_status s = buffer_room(g, &g->kv, (size_t)words * sizeof(uint32_t), true, err);
    if (s) return s;
    begin_commands(g);
    vkCmdFillBuffer(g->cmd, g->kv.buf, 0, VK_WHOLE_SIZE, 0);
    return submit_and_wait(g, "clearing the KV cache", err);
}

quill_status quill_gpu_kv_copy(quill_gpu *g, const uint64_t *src, const uint64_t *dst, const uint64_t *words, int n,
                               quill_error *err) {
    begin_commands(g);
    for (int i = 0; i < n; i++) {
        if ((src[i] + words[i]) * sizeof(uint32_t) > g->kv.bytes || (dst[i] + words[i]) * sizeof(uint32_t) > g->kv.bytes) {
            vkEndCommandBuffer(g->cmd);
            return quill_fail(err, QUILL_E_ARG, "vulkan: a copy within the KV cache past its end");
        }
        if (!words[i]) continue;
        const VkBufferCopy copy = {src[i] * sizeof(uint32_t), dst[i] * sizeof(uint32_t), words[i] * sizeof(uint32_t)};
        vkCmdCopyBuffer(g->cmd, g->kv.buf, g->kv.buf, 1, &copy);
    }
    return submit_and_wait(g, "copying a sequence's KV cache", err);
}

static void step_fail(quill_gpu *g, quill_status s, const char *what);

/* A new, zeroed operation at the end of the step's (NULL after a failure, which the step keeps). */
static step_op *step_op_add(quill_gpu *g, step_op_kind kind) {
    if (g->n_ops == g->cap_ops) {
        const int cap = g->cap_ops ? 2 * g->cap_ops : 512;
        step_op *ops = realloc(g->ops, (size_t)cap * sizeof *ops), *kept = NULL;
        if (ops) g->ops = ops;
        if (ops) kept = realloc(g->kept_ops, (size_t)cap * sizeof *kept);
        if (kept) g->kept_ops = kept;
        if (!ops || !kept) {
            step_fail(g, QUILL_E_NOMEM, "out of memory for a step's operations");
            return NULL;
        }
        g->cap_ops = cap;
    }
    step_op *op = &g->ops[g->n_ops++];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    return op;
}

quill_status quill_gpu_step_begin(quill_gpu *g, uint64_t act_floats, const float *in, uint64_t in_at, uint64_t in_floats,
                                  const int32_t *pos, const int32_t *seq, const float *attn_factor, int n_tok,
                                  int max_dispatches, quill_error *err) {
    if (act_floats > SHADER_FLOATS || in_at + in_floats > act_floats || n_tok <= 0 || max_dispatches <= 0)
        return quill_fail(err, QUILL_E_ARG, "vulkan: a step of %llu floats of activations (input %llu at %llu), %d tokens",
                          (unsigned long long)act_floats, (unsigned long long)in_floats, (unsigned long long)in_at, n_tok);
    g->io_tokens_at = aligned(act_floats * sizeof(float), 256);
    quill_status s;
    if ((s = buffer_room(g, &g->act, act_floats * sizeof(float), true, err)) ||
        (s = buffer_room(g, &g->io, g->io_tokens_at + (size_t)n_tok * 4 * sizeof(int32_t), false, err)) ||
        (s = buffer_room(g, &g->codes, act_floats * sizeof(int32_t), true, err)) ||
        (s = buffer_room(g, &g->da, (act_floats / 32 + 1) * sizeof(float), true, err)))
        return s;
    if (!g->kv.buf && (s = buffer_room(g, &g->kv, 4, true, err))) return s;
    if (g->step_sets < max_dispatches) {
        if (g->step_pool) vkDestroyDescriptorPool(g->device, g->step_pool, NULL);
        g->step_pool = VK_NULL_HANDLE;
        g->step_sets = 0;
        const VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, (uint32_t)max_dispatches * BINDINGS};
        const VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                                .maxSets = (uint32_t)max_dispatches, .poolSizeCount = 1, .pPoolSizes = &ps};
        VkResult r = vkCreateDescriptorPool(g->device, &dpi, NULL, &g->step_pool);
        if (r != VK_SUCCESS) return vk_fail(err, r, "vkCreateDescriptorPool");
        g->step_sets = max_dispatches;
    } else {
        vkResetDescriptorPool(g->device, g->step_pool, 0);
    }
    memcpy(g->io.map, in, in_floats * sizeof(float));
    int32_t *tok = (int32_t *)((char *)g->io.map + g->io_tokens_at);
    for (int t = 0; t < n_tok; t++) {
        const float f = attn_factor ? attn_factor[t] : 1.0f;
        tok[4 * t] = pos[t], tok[4 * t + 1] = seq[t], tok[4 * t + 3] = 0;
        memcpy(&tok[4 * t + 2], &f, sizeof f);
    }
    g->step_status = QUILL_OK;
    g->stepping = true;
    if (g->set_cache_stale) {
        set_cache_clear(g);
        g->set_cache_stale = false;
    }
    if (g->profile) g->profile->begin_ns = now_ns();
    g->n_ops = 0;
    g->ops_pool_set = false;
    step_op *op = step_op_add(g, OP_COPY_IN);
    if (op) op->to = in_at * sizeof(float), op->bytes = in_floats * sizeof(float);
    return g->step_status ? g->step_status : QUILL_OK;
}

/* One binding of a step's dispatch: a buffer from a byte offset on. */
typedef struct {
    const gpu_buffer *buf;
    size_t offset;
} step_binding;

static step_binding act_at(quill_gpu *g, uint64_t at) { return (step_binding){&g->act, at * sizeof(float)}; }

static void write_set(quill_gpu *g, VkDescriptorSet set, const VkDescriptorBufferInfo info[BINDINGS]) {
    VkWriteDescriptorSet w[BINDINGS];
    for (int i = 0; i < BINDINGS; i++)
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set, .dstBinding = (uint32_t)i,
                                      .descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                      .pBufferInfo = &info[i]};
    vkUpdateDescriptorSets(g->device, BINDINGS, w, 0, NULL);
}

/* A descriptor set of these bindings for a step's dispatch: the kept one (set_cache), else a new one
 * kept, else (the cache full) one of this step's pool; VK_NULL_HANDLE when that is spent too. */
static VkDescriptorSet step_set(quill_gpu *g, const VkDescriptorBufferInfo info[BINDINGS], bool *from_pool) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (int i = 0; i < BINDINGS; i++) {
        const uint64_t v[2] = {(uint64_t)(uintptr_t)info[i].buffer, info[i].offset};
        for (int k = 0; k < 2; k++) h = (h ^ v[k]) * 0x100000001B3ull, h ^= h >> 29;
    }
    for (uint32_t probe = 0; probe < SET_CACHE_SLOTS; probe++) {
        cached_set *e = &g->set_cache[(h + probe) % SET_CACHE_SLOTS];
        if (!e->set) {
            if (g->set_cache_used >= g->set_cache_max) {
                /* (the layouts of other batch sizes filled it: the steps to come get room) */
                g->set_cache_stale = true;
                break;
            }
            const VkDescriptorSetAllocateInfo dai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                                     .descriptorPool = g->cache_pool, .descriptorSetCount = 1,
                                                     .pSetLayouts = &g->set_layout};
            if (vkAllocateDescriptorSets(g->device, &dai, &e->set) != VK_SUCCESS) {
                e->set = VK_NULL_HANDLE;
                break;
            }
            for (int i = 0; i < BINDINGS; i++) e->buf[i] = info[i].buffer, e->offset[i] = info[i].offset;
            write_set(g, e->set, info);
            g->set_cache_used++;
            return e->set;
        }
        bool same = true;
        for (int i = 0; i < BINDINGS && same; i++) same = e->buf[i] == info[i].buffer && e->offset[i] == info[i].offset;
        if (same) return e->set;
    }
    const VkDescriptorSetAllocateInfo dai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                             .descriptorPool = g->step_pool, .descriptorSetCount = 1,
                                             .pSetLayouts = &g->set_layout};
    VkDescriptorSet set;
    if (vkAllocateDescriptorSets(g->device, &dai, &set) != VK_SUCCESS) return VK_NULL_HANDLE;
    write_set(g, set, info);
    *from_pool = true;
    return set;
}

/* Records a dispatch of `pipe` over n workgroups, then a barrier before whatever comes next reads
 * or overwrites what it wrote. Bindings left {NULL}: the activations from their start. */
static void record(quill_gpu *g, int pipe, const step_binding b[BINDINGS], const uint32_t *push, size_t words,
                   uint64_t n) {
    if (g->step_status) return;
    if (!g->stepping) {
        step_fail(g, QUILL_E_ARG, "an operation recorded outside a step");
        return;
    }
    VkDescriptorBufferInfo info[BINDINGS];
    for (int i = 0; i < BINDINGS; i++) {
        const step_binding bi = b[i].buf ? b[i] : act_at(g, 0);
        if (bi.offset % g->offset_alignment || bi.offset >= bi.buf->bytes) {
            step_fail(g, QUILL_E_ARG, "a step's operation reads or writes past its buffers (or at a misaligned offset)");
            return;
        }
        info[i] = (VkDescriptorBufferInfo){bi.buf->buf, bi.offset, VK_WHOLE_SIZE};
    }
    bool from_pool = false;
    VkDescriptorSet set = step_set(g, info, &from_pool);
    if (!set) {
        step_fail(g, QUILL_E_ARG, "a step has more operations than quill_gpu_step_begin made room for");
        return;
    }
    g->ops_pool_set |= from_pool;
    step_op *op = step_op_add(g, OP_DISPATCH);
    if (!op) return;
    /* (the products' split way, push word 5, under a label of its own in the profile) */
    const bool split = pipe >= PIPE_EXACT_FIRST && pipe < PIPE_TILED_FIRST && words > 5 && push[5];
    op->pipe = pipe, op->label = pipe + (split ? PIPE_COUNT : 0), op->set = set, op->groups = n;
    op->words = (uint32_t)words;
    memcpy(op->push, push, words * sizeof(uint32_t));
}

/* An uploaded vector or matrix as a binding, or a failure of the step naming it. */
static const gpu_buffer *step_resident(quill_gpu *g, const void *host, size_t bytes, const char *what) {
    const gpu_buffer *b = resident_of(g, host, bytes);
    if (!b) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s of a step was not uploaded (quill_gpu_upload)", what);
        step_fail(g, QUILL_E_ARG, msg);
    }
    return b;
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

void quill_gpu_rmsnorm(quill_gpu *g, uint64_t x_at, uint64_t add_at, const float *weight, uint64_t out_at, int64_t d,
                       int n_tok, double eps) {
    quill_gpu_norm(g, x_at, add_at, weight, out_at, d, n_tok, eps, false);
}

void quill_gpu_norm(quill_gpu *g, uint64_t x_at, uint64_t add_at, const float *weight, uint64_t out_at, int64_t d,
                    int n_tok, double eps, bool layer_norm) {
    const bool has_out = out_at != QUILL_GPU_NONE, has_add = add_at != QUILL_GPU_NONE;
    if (has_out && layer_norm && !weight) {
        step_fail(g, QUILL_E_ARG, "a LayerNorm without its weight");
        return;
    }
    const gpu_buffer *w = has_out && weight ? step_resident(g, weight, (size_t)d * sizeof(float), "a norm's weight") : &g->act;
    if (!w) return;
    const step_binding b[BINDINGS] = {act_at(g, x_at), act_at(g, has_add ? add_at : x_at), {w, 0},
                                      act_at(g, has_out ? out_at : x_at)};
    uint64_t eps_bits;
    memcpy(&eps_bits, &eps, sizeof eps_bits);
    const uint32_t push[8] = {(uint32_t)d,        (uint32_t)n_tok,
                              has_add,            has_out,
                              (uint32_t)eps_bits, (uint32_t)(eps_bits >> 32),
                              layer_norm,         weight != NULL};
    record(g, PIPE_RMSNORM, b, push, 8, (uint64_t)n_tok);
}

/* The products of n weights with the same x (x_div 0), or a mixture-of-experts layer's experts'
 * (x_div > 0: "tokens" are n_out (token, slot) pairs, pair p's expert the int at ids_at + p and its
 * activations row p / x_div of x's n_x rows). */
static void step_products_of(quill_gpu *g, const quill_gpu_mat *w, int n, int64_t cols, uint64_t x_at, int n_x,
                             const uint64_t *y_at, int n_out, int x_div, uint64_t ids_at) {
    int quantized_for = -1; /* the act_max of the codes made for this x */
    for (int i = 0; i < n && !g->step_status; i++) {
        quill_error e;
        const int64_t experts = w[i].n_expert > 1 ? w[i].n_expert : 1;
        quill_status bad = check_product(&w[i], cols, n_out, &e);
        if (!bad && (uint64_t)experts * (uint64_t)w[i].rows * w[i].row_bytes > UINT32_MAX / 2)
            bad = quill_fail(&e, QUILL_E_ARG, "vulkan: an expert tensor of %lld x %lld x %lld %s weights is out of range",
                             (long long)experts, (long long)w[i].rows, (long long)cols, quill_type_name(w[i].type));
        if (bad) {
            g->step_status = bad;
            g->step_err = e;
            return;
        }
        const gpu_buffer *wb =
            step_resident(g, w[i].w, (size_t)experts * (size_t)w[i].rows * w[i].row_bytes, "a weight matrix");
        if (!wb) return;
        const bool exact = exact_kind(w[i].type) >= 0;
        const size_t xs = (size_t)cols * (size_t)n_x;
        /* the codes once for the group, again where a type wants another act_max */
        if (exact && act_max(w[i].type) != quantized_for) {
            quantized_for = act_max(w[i].type);
            const step_binding qb[BINDINGS] = {act_at(g, x_at), {&g->codes, 0}, {&g->da, 0}, act_at(g, x_at)};
            const uint32_t qp[2] = {(uint32_t)(xs / 32), (uint32_t)quantized_for};
            record(g, PIPE_QUANTIZE, qb, qp, 2, (xs / 32 + 1) / 2); /* (two blocks a workgroup) */
        }
        const int64_t parts = exact ? cols / slot_width(w[i].type) : (cols + 31) / 32;
        const bool split = g->split && n_out <= SPLIT_MAX_TOKENS && (exact || parts <= SPLIT_MAX_PARTS);
        const uint32_t pp[8] = {(uint32_t)w[i].rows, (uint32_t)cols, (uint32_t)n_out, (uint32_t)w[i].row_bytes,
                                (uint32_t)(exact ? exact_kind(w[i].type) : float_kind(w[i].type)), split,
                                (uint32_t)x_div, (uint32_t)ids_at};
        const step_binding b[BINDINGS] = {{wb, 0}, exact ? (step_binding){&g->codes, 0} : act_at(g, x_at), {&g->da, 0},
                                          act_at(g, y_at[i]), act_at(g, 0), {&g->grids, 0}};
        const uint64_t pairs = (uint64_t)w[i].rows * (uint64_t)n_out;
        const bool tiled = x_div == 0 && tiled_product(g, w[i].type, n_out);
        int pipe;
        if ((bad = product_pipe(g, w[i].type, tiled, &pipe, &e))) {
            g->step_status = bad;
            g->step_err = e;
            return;
        }
        record(g, pipe, b, pp, 8, tiled ? tiles(w[i].rows, n_out) : split_groups(exact, split, pairs));
    }
}

void quill_gpu_step_products(quill_gpu *g, const quill_gpu_mat *w, int n, int64_t cols, uint64_t x_at,
                             const uint64_t *y_at, int n_tok) {
    step_products_of(g, w, n, cols, x_at, n_tok, y_at, n_tok, 0, 0);
}

void quill_gpu_step_expert_products(quill_gpu *g, const quill_gpu_mat *w, int n, int64_t cols, uint64_t x_at, int x_div,
                                    uint64_t ids_at, const uint64_t *y_at, int n_pairs) {
    if (x_div <= 0 || n_pairs % x_div) {
        step_fail(g, QUILL_E_ARG, "experts' products whose pairs are not whole tokens");
        return;
    }
    step_products_of(g, w, n, cols, x_at, n_pairs / x_div, y_at, n_pairs, x_div, ids_at);
}

void quill_gpu_route_logits(quill_gpu *g, const float *w, int64_t rows, int64_t cols, uint64_t x_at, const float *bias,
                            uint64_t out_at, int n_tok) {
    const gpu_buffer *wb = step_resident(g, w, (size_t)rows * (size_t)cols * sizeof(float), "a router's weights");
    const gpu_buffer *bb = wb && bias ? step_resident(g, bias, (size_t)rows * sizeof(float), "a router's bias") : NULL;
    if (!wb || (bias && !bb)) return;
    if (out_at % 2) {
        step_fail(g, QUILL_E_ARG, "a router's float64 logits at an odd float");
        return;
    }
    const step_binding b[BINDINGS] = {{wb, 0}, act_at(g, x_at), bb ? (step_binding){bb, 0} : act_at(g, 0), act_at(g, out_at)};
    const uint32_t push[4] = {(uint32_t)rows, (uint32_t)cols, (uint32_t)n_tok, bias != NULL};
    record(g, PIPE_ROUTE_LOGITS, b, push, 4, groups((uint64_t)rows * (uint64_t)n_tok));
}

void quill_gpu_route_select(quill_gpu *g, const quill_gpu_routing *r, int64_t n_expert, int64_t k, uint64_t logits_at,
                            uint64_t select_at, uint64_t weights_at, uint64_t ids_at, int n_tok) {
    if (k < 1 || k > QUILL_GPU_MAX_USED || k > n_expert || r->n_group > QUILL_GPU_MAX_GROUPS || logits_at % 2 ||
        select_at % 2) {
        step_fail(g, QUILL_E_ARG, "a router's choice out of the device's range");
        return;
    }
    const gpu_buffer *pb =
        r->probs_bias ? step_resident(g, r->probs_bias, (size_t)n_expert * sizeof(float), "a router's selection bias") : NULL;
    if (r->probs_bias && !pb) return;
    const step_binding b[BINDINGS] = {act_at(g, logits_at), act_at(g, select_at), pb ? (step_binding){pb, 0} : act_at(g, 0),
                                      act_at(g, weights_at), act_at(g, ids_at)};
    const uint32_t push[9] = {(uint32_t)n_expert, (uint32_t)k, (uint32_t)n_tok, (uint32_t)r->gating, r->probs_bias != NULL,
                              (uint32_t)r->n_group, (uint32_t)r->n_group_used, r->norm_w, float_bits(r->w_scale)};
    record(g, PIPE_ROUTE_SELECT, b, push, 9, groups((uint64_t)n_tok));
}

void quill_gpu_moe_sum(quill_gpu *g, uint64_t y_at, uint64_t weights_at, int64_t d, int64_t k, uint64_t shared_at,
                       uint64_t gate_at, uint64_t out_at, int n_tok) {
    const bool shared = shared_at != QUILL_GPU_NONE, gate = gate_at != QUILL_GPU_NONE;
    const step_binding b[BINDINGS] = {act_at(g, y_at), act_at(g, weights_at), act_at(g, shared ? shared_at : 0),
                                      act_at(g, out_at), act_at(g, gate ? gate_at : 0)};
    const uint32_t push[5] = {(uint32_t)d, (uint32_t)k, (uint32_t)n_tok, shared, gate};
    record(g, PIPE_MOE_SUM, b, push, 5, groups((uint64_t)d * (uint64_t)n_tok));
}

void quill_gpu_rope(quill_gpu *g, uint64_t v_at, int64_t n_heads, int64_t hd, int64_t half, int64_t stride, bool neox,
                    const float *cos_table, const float *sin_table, uint64_t table_at, int n_tok) {
    if (half <= 0) return; /* (no rotated dimensions) */
    const gpu_buffer *cb = step_resident(g, cos_table, 4, "RoPE's cos table"),
                     *sb = cb ? step_resident(g, sin_table, 4, "RoPE's sin table") : NULL;
    if (!sb) return;
    const step_binding b[BINDINGS] = {act_at(g, v_at), {cb, 0}, {sb, 0}, {&g->io, g->io_tokens_at}};
    const uint32_t push[7] = {(uint32_t)n_heads, (uint32_t)hd,   (uint32_t)half, (uint32_t)stride,
                              neox,              (uint32_t)n_tok, (uint32_t)table_at};
    record(g, PIPE_ROPE, b, push, 7, groups((uint64_t)n_tok * (uint64_t)n_heads * (uint64_t)half));
}

void quill_gpu_kv_store(quill_gpu *g, const quill_gpu_kv_layer *kv, uint64_t k_at, uint64_t v_at, int64_t kv_dim,
                        int64_t hd, int n_tok) {
    if (!quill_gpu_kv_type_ok(kv->type_k, hd) || !quill_gpu_kv_type_ok(kv->type_v, hd) || kv_dim % hd) {
        step_fail(g, QUILL_E_UNSUPPORTED, "a KV cache type the device does not store for these heads");
        return;
    }
    const step_binding b[BINDINGS] = {act_at(g, k_at), act_at(g, v_at), {&g->kv, 0}, {&g->io, g->io_tokens_at}};
    const uint32_t push[10] = {(uint32_t)kv_dim,          (uint32_t)hd,          (uint32_t)kv->n_ctx,
                               (uint32_t)n_tok,           (uint32_t)kv->k_base,  (uint32_t)kv->v_base,
                               (uint32_t)kv->k_seq_stride, (uint32_t)kv->v_seq_stride, (uint32_t)kv_kind(kv->type_k),
                               (uint32_t)kv_kind(kv->type_v)};
    /* (one invocation per token, keys or values, head and block of 32) */
    record(g, PIPE_KV_STORE, b, push, 10, groups((uint64_t)n_tok * 2 * (uint64_t)(kv_dim / hd) * (uint64_t)((hd + 31) / 32)));
}

void quill_gpu_attention(quill_gpu *g, const quill_gpu_kv_layer *kv, uint64_t q_at, uint64_t out_at, int64_t n_head,
                         int64_t n_head_kv, int64_t hd, float scale, int64_t window, float softcap, const float *sinks,
                         int n_tok) {
    if (hd > 256 || n_head_kv <= 0 || n_head % n_head_kv) {
        step_fail(g, QUILL_E_UNSUPPORTED, "attention with heads wider than 256 or query heads not a multiple of the KV heads");
        return;
    }
    const gpu_buffer *sb = sinks ? step_resident(g, sinks, (size_t)n_head * sizeof(float), "attention's sinks") : NULL;
    if (sinks && !sb) return;
    const step_binding b[BINDINGS] = {act_at(g, q_at), {&g->kv, 0}, {&g->io, g->io_tokens_at}, act_at(g, out_at),
                                      sb ? (step_binding){sb, 0} : act_at(g, 0)};
    const uint32_t push[16] = {(uint32_t)n_head,
                               (uint32_t)n_head_kv,
                               (uint32_t)hd,
                               (uint32_t)kv->n_ctx,
                               (uint32_t)n_tok,
                               (uint32_t)kv->k_base,
                               (uint32_t)kv->v_base,
                               (uint32_t)kv->k_seq_stride,
                               (uint32_t)kv->v_seq_stride,
                               float_bits(scale),
                               (uint32_t)(window > 0 && window < INT32_MAX ? window : 0),
                               float_bits(softcap),
                               g->attention_kept,
                               sinks != NULL,
                               (uint32_t)kv_kind(kv->type_k),
                               (uint32_t)kv_kind(kv->type_v)};
    record(g, PIPE_ATTENTION, b, push, 16, (uint64_t)n_tok * (uint64_t)n_head);
}

void quill_gpu_glu(quill_gpu *g, uint64_t gate_at, uint64_t up_at, int64_t n, quill_gpu_activation act) {
    const step_binding b[BINDINGS] = {act_at(g, gate_at), act_at(g, up_at), act_at(g, gate_at), act_at(g, gate_at)};
    const uint32_t push[2] = {(uint32_t)n, (uint32_t)act};
    record(g, PIPE_GLU, b, push, 2, groups((uint64_t)n));
}

void quill_gpu_add_rows(quill_gpu *g, uint64_t x_at, const float *bias, int64_t n, int64_t n_rows) {
    const gpu_buffer *b = step_resident(g, bias, (size_t)n * sizeof(float), "a bias");
    if (!b) return;
    const step_binding bb[BINDINGS] = {act_at(g, x_at), {b, 0}, act_at(g, x_at), act_at(g, x_at)};
    const uint32_t push[4] = {(uint32_t)n, (uint32_t)n_rows, 0, 0};
    record(g, PIPE_ADD_ROWS, bb, push, 4, groups((uint64_t)n * (uint64_t)n_rows));
}

void quill_gpu_add_rows_by_id(quill_gpu *g, uint64_t x_at, const float *bias, int64_t n_expert, int64_t n, uint64_t ids_at,
                              int n_pairs) {
    const gpu_buffer *b = step_resident(g, bias, (size_t)(n_expert * n) * sizeof(float), "an expert tensor's biases");
    if (!b) return;
    const step_binding bb[BINDINGS] = {act_at(g, x_at), {b, 0}, act_at(g, x_at), act_at(g, x_at), act_at(g, 0)};
    const uint32_t push[4] = {(uint32_t)n, (uint32_t)n_pairs, 1, (uint32_t)ids_at};
    record(g, PIPE_ADD_ROWS, bb, push, 4, groups((uint64_t)n * (uint64_t)n_pairs));
}

void quill_gpu_scale(quill_gpu *g, uint64_t x_at, uint64_t n, float s) {
    const step_binding b[BINDINGS] = {act_at(g, x_at), act_at(g, x_at), act_at(g, x_at), act_at(g, x_at)};
    const uint32_t push[2] = {(uint32_t)n, float_bits(s)};
    record(g, PIPE_SCALE, b, push, 2, groups(n));
}

void quill_gpu_copy(quill_gpu *g, uint64_t from_at, uint64_t to_at, uint64_t n) {
    if (g->step_status || !n || from_at == to_at) return;
    if ((from_at + n) * sizeof(float) > g->act.bytes || (to_at + n) * sizeof(float) > g->act.bytes) {
        step_fail(g, QUILL_E_ARG, "a copy within a step's activations past their end");
        return;
    }
    step_op *op = step_op_add(g, OP_COPY);
    if (op) op->from = from_at * sizeof(float), op->to = to_at * sizeof(float), op->bytes = n * sizeof(float);
}

/* The step's operations into cmd, each followed by the barrier before whatever comes next reads
 * or overwrites what it wrote (and the profile's timestamp). */
static void record_ops(quill_gpu *g, VkCommandBuffer cmd) {
    if (g->profile) {
        g->profile->used = 0;
        vkCmdResetQueryPool(cmd, g->profile->pool, 0, PROFILE_QUERIES);
        profile_mark(g, cmd, 2 * PIPE_COUNT);
    }
    for (int i = 0; i < g->n_ops; i++) {
        const step_op *op = &g->ops[i];
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER};
        VkPipelineStageFlags src = VK_PIPELINE_STAGE_TRANSFER_BIT, dst = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
        if (op->kind == OP_DISPATCH) {
            vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->pipes[op->pipe]);
            vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->pipe_layout, 0, 1, &op->set, 0, NULL);
            vkCmdPushConstants(cmd, g->pipe_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, op->words * (uint32_t)sizeof(uint32_t),
                               op->push);
            dispatch(g, cmd, op->groups);
            mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
            mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT;
            src = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
            dst = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
        } else if (op->kind == OP_COPY_IN) {
            if (op->bytes) {
                const VkBufferCopy copy = {0, op->to, op->bytes};
                vkCmdCopyBuffer(cmd, g->io.buf, g->act.buf, 1, &copy);
            }
            mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
            mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
        } else if (op->kind == OP_COPY) {
            const VkBufferCopy copy = {op->from, op->to, op->bytes};
            vkCmdCopyBuffer(cmd, g->act.buf, g->act.buf, 1, &copy);
            mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
            mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                               VK_ACCESS_TRANSFER_WRITE_BIT;
            dst = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
        } else {
            if (op->bytes) {
                const VkBufferCopy copy = {op->from, 0, op->bytes};
                vkCmdCopyBuffer(cmd, g->act.buf, g->io.buf, 1, &copy);
            }
            mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
            mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
            dst = VK_PIPELINE_STAGE_HOST_BIT;
        }
        vkCmdPipelineBarrier(cmd, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
        if (op->kind != OP_COPY_IN) profile_mark(g, cmd, op->kind == OP_DISPATCH ? op->label : 2 * PIPE_COUNT);
    }
}

quill_status quill_gpu_step_end(quill_gpu *g, uint64_t out_at, uint64_t out_floats, float *out, quill_error *err) {
    g->stepping = false;
    if (!g->step_status && out && (out_at + out_floats) * sizeof(float) > g->act.bytes)
        step_fail(g, QUILL_E_ARG, "a step's output past its activations");
    step_op *op = g->step_status ? NULL : step_op_add(g, OP_COPY_OUT);
    if (op && out) op->from = out_at * sizeof(float), op->bytes = out_floats * sizeof(float);
    if (g->step_status) {
        if (err) *err = g->step_err;
        return g->step_status;
    }
    /* the step recorded last again, when this one's operations are its (bindings, push constants
     * and sizes: the data that differ, the tokens' embeddings and positions, are in io) */
    quill_status s = QUILL_OK;
    if (g->replay_ok && g->n_ops == g->n_kept && !memcmp(g->ops, g->kept_ops, (size_t)g->n_ops * sizeof *g->ops)) {
        g->replays++;
    } else {
        g->replay_ok = false;
        const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        vkResetCommandBuffer(g->step_cmd, 0);
        vkBeginCommandBuffer(g->step_cmd, &bi);
        record_ops(g, g->step_cmd);
        const VkResult r = vkEndCommandBuffer(g->step_cmd);
        if (r != VK_SUCCESS) s = vk_fail(err, r, "vkEndCommandBuffer");
        memcpy(g->kept_ops, g->ops, (size_t)g->n_ops * sizeof *g->ops);
        g->n_kept = g->n_ops;
        /* (the step pool's sets are reset by the next step) */
        g->replay_ok = !s && !g->ops_pool_set;
    }
    const double recorded = g->profile ? now_ns() : 0;
    if (!s) s = submit_cmd(g, g->step_cmd, "running a step", err);
    if (g->profile) {
        g->profile->record_ns += recorded - g->profile->begin_ns;
        g->profile->wait_ns += now_ns() - recorded;
        if (!s) profile_collect(g);
    }
    if (!s && out && out_floats) memcpy(out, g->io.map, out_floats * sizeof(float));
    return s;
}
#else
typedef int quill_gpu_vulkan_unused; /* (ISO C wants a translation unit to declare something) */
#endif
