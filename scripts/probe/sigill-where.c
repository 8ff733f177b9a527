// LD_PRELOAD library that names the instruction behind a SIGILL: the faulting address, the
// shared object and nearest symbol (dladdr), the instruction bytes, then exits 132.
//   gcc -O1 -shared -fPIC -o /tmp/sigill-where.so scripts/probe/sigill-where.c -ldl
//   LD_PRELOAD=/tmp/sigill-where.so ./some-test-binary
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static void on_sigill(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = ctx;
    unsigned char *pc = (unsigned char *)uc->uc_mcontext.gregs[REG_RIP];
    Dl_info info;
    memset(&info, 0, sizeof info);
    dladdr(pc, &info);
    fprintf(stderr, "\nSIGILL at %p (si_addr %p) in %s (base %p), symbol %s+0x%lx\nbytes:", pc,
            si->si_addr, info.dli_fname ? info.dli_fname : "?", info.dli_fbase,
            info.dli_sname ? info.dli_sname : "?",
            info.dli_saddr ? (unsigned long)(pc - (unsigned char *)info.dli_saddr) : 0ul);
    for (int i = 0; i < 16; i++) fprintf(stderr, " %02x", pc[i]);
    fprintf(stderr, "\nobject offset 0x%lx\n", (unsigned long)(pc - (unsigned char *)info.dli_fbase));
    (void)sig;
    _exit(132);
}

__attribute__((constructor)) static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigill;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGILL, &sa, NULL);
}
