/* Preloaded into llama.cpp's tools by workbench.llama_kld (run_tool; tests/runtime uses it too).

   llama.cpp's tools print through common/log.cpp's logger: LOG() queues each message and a
   worker thread prints the queue (stdout for LOG, stderr for LOG_INF ...). The logger is a
   leaked singleton that nothing drains at exit, so up to a queue's worth (512 messages) of
   the end of the output is lost whenever main() returns before the worker catches up: about
   half of llama-embedding's JSON runs ended short, rc 0. The tools' last call before
   returning is llama_backend_free(); this one first pauses the logger (common_log_pause:
   it queues a stop entry and joins the worker, which prints everything queued before it),
   then calls llama.cpp's own. No output is changed or dropped: the process simply exits
   after its log is printed. Where the symbols are absent (a static build) it only forwards. */
#define _GNU_SOURCE
#include <dlfcn.h>

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
