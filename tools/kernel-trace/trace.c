// A kernel tracer for machines without Nsight Systems (the device has none): a CUDA injection
// library (CUDA_INJECTION64_PATH) that records, through CUPTI's activity API, every kernel
// (graph-launched ones included), memcpy, memset and runtime API call of the process, and writes
// them at exit as CSV to $KTRACE_OUT (default ktrace-%p.csv, %p the process id):
//
//   k,<start ns>,<end ns>,<stream>,<graph id>,<kernel name>     a kernel
//   m,<start ns>,<end ns>,<stream>,<copy kind>,<bytes>          a memcpy (kind: 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP)
//   s,<start ns>,<end ns>,<stream>,0,<bytes>                    a memset
//   r,<start ns>,<end ns>,<thread>,<cbid>,<runtime API name>    a runtime API call
//
// tools/kernel-trace/summarise.py turns two traces into a per-step comparison. Built by
// tools/kernel-trace/build.sh against the CUPTI of the PyPI wheel (nvidia-cuda-cupti).
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#define BUF_SIZE (8u << 20)
#define CHECK(call)                                                                    \
  do {                                                                                 \
    CUptiResult r_ = (call);                                                           \
    if (r_ != CUPTI_SUCCESS) {                                                         \
      const char *s_ = "?";                                                            \
      cuptiGetResultString(r_, &s_);                                                   \
      fprintf(stderr, "ktrace: %s failed: %s\n", #call, s_);                           \
    }                                                                                  \
  } while (0)

static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void CUPTIAPI requested(uint8_t **buf, size_t *size, size_t *max_records) {
  *buf = (uint8_t *)aligned_alloc(8, BUF_SIZE);
  *size = *buf ? BUF_SIZE : 0;
  *max_records = 0;
}

static void csv_name(const char *s) {
  // Kernel names are demangled C++ with commas inside template arguments: quote them.
  fputc('"', out);
  for (; s && *s; s++) fputc(*s == '"' ? '\'' : *s, out);
  fputs("\"\n", out);
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                               size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity *rec = NULL;
  pthread_mutex_lock(&lock);
  while (out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)rec;
        fprintf(out, "k,%llu,%llu,%u,%u,", (unsigned long long)k->start,
                (unsigned long long)k->end, k->streamId, k->graphId);
        csv_name(k->name);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)rec;
        fprintf(out, "m,%llu,%llu,%u,%u,%llu\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, (unsigned)m->copyKind,
                (unsigned long long)m->bytes);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)rec;
        fprintf(out, "s,%llu,%llu,%u,0,%llu\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)rec;
        const char *name = NULL;
        cuptiGetCallbackName(rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API
                                                                      : CUPTI_CB_DOMAIN_DRIVER_API,
                             a->cbid, &name);
        fprintf(out, "%c,%llu,%llu,%u,%u,", rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? 'r' : 'd',
                (unsigned long long)a->start, (unsigned long long)a->end, a->threadId, a->cbid);
        csv_name(name);
        break;
      }
      default:
        break;
    }
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped);
  if (dropped) fprintf(stderr, "ktrace: %zu records dropped\n", dropped);
  pthread_mutex_unlock(&lock);
  free(buf);
}

static void at_exit(void) {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  pthread_mutex_lock(&lock);
  if (out) fclose(out);
  out = NULL;
  pthread_mutex_unlock(&lock);
}

int InitializeInjection(void) {
  // "%p" in $KTRACE_OUT becomes the process id (a traced process's children trace too).
  const char *path = getenv("KTRACE_OUT");
  char name[4096];
  const char *pat = path && *path ? path : "ktrace-%p.csv";
  const char *at = strstr(pat, "%p");
  if (at)
    snprintf(name, sizeof name, "%.*s%d%s", (int)(at - pat), pat, (int)getpid(), at + 2);
  else
    snprintf(name, sizeof name, "%s", pat);
  out = fopen(name, "w");
  if (!out) {
    perror("ktrace: open");
    return 0;
  }
  // The first line names the process ("# argv..."), so a parent's and a child's traces tell apart.
  fputs("#", out);
  FILE *cmd = fopen("/proc/self/cmdline", "r");
  for (int c; cmd && (c = fgetc(cmd)) != EOF;) fputc(c ? c : ' ', out);
  if (cmd) fclose(cmd);
  fputc('\n', out);
  CHECK(cuptiActivityRegisterCallbacks(requested, completed));
  CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
  if (getenv("KTRACE_DRIVER")) CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER));
  atexit(at_exit);
  return 1;
}
