/* Preloaded into llama.cpp's tools by workbench.llama_kld (run_tool; tests/runtime uses it too).

   llama.cpp's tools print through common/log.cpp's logger: LOG() queues each message and a
   worker thread prints the queue (stdout for LOG, stderr for LOG_INF ...). The logger is a
   leaked singleton that nothing drains at exit, so up to a queue's worth (512 messages) of
   the end of the output is lost whenever main() returns before the worker catches up: about
   half of llama-embedding's JSON runs ended short, rc 0. The tools' last call before
   returning is llama_backend_free(); this one first pauses the logger (common_log_pause:
   it queues a stop entry and joins the worker, which prints everything queued before it),
   then calls llama.cpp's own. No output is changed or dropped: the process simply exits
   after its log is printed. Where the symbols are absent (a static build) it only forwards.

   Second job: while LLAMA_ARG_REPACK is false (workbench.export.llama_tools.tool_env sets it),
   ggml's CPU backend is asked in vain for its extra buffer types
   ("ggml_backend_dev_get_extra_bufts": the repacked and AMX layouts), so every tool keeps its
   weights in plain CPU buffers, the tools that ignore --no-repack (llama-simple) too: on a
   host whose CPU advertises AMX but whose kernel traps it, the AMX buffer type's matmuls die
   with SIGILL (tilezero). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

static int repack_off(void) {
    const char *v = getenv("LLAMA_ARG_REPACK");
    return v && (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "off")
                 || !strcmp(v, "disabled"));
}

void *ggml_backend_reg_get_proc_address(void *reg, const char *name) {
    void *(*next)(void *, const char *) =
        (void *(*)(void *, const char *)) dlsym(RTLD_NEXT, "ggml_backend_reg_get_proc_address");
    if (name && !strcmp(name, "ggml_backend_dev_get_extra_bufts") && repack_off()) {
        return NULL;
    }
    return next ? next(reg, name) : NULL;
}

struct common_log;

void llama_backend_free(void) {
    struct common_log *(*log_main)(void) =
        (struct common_log *(*)(void)) dlsym(RTLD_DEFAULT, "_Z15common_log_mainv");
    void (*log_pause)(struct common_log *) =
        (void (*)(struct common_log *)) dlsym(RTLD_DEFAULT, "_Z16common_log_pauseP10common_log");
    if (log_main && log_pause) {
        log_pause(log_main());
    }
    void (*next)(void) = (void (*)(void)) dlsym(RTLD_NEXT, "llama_backend_free");
    if (next) {
        next();
    }
}
