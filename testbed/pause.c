/*
 * Minimal pod sandbox ("pause") process for the autonomic test bed.
 *
 * Modelled on Kubernetes' build/pause/linux/pause.c: it holds the pod's
 * namespaces, reaps zombies (it may be PID 1 of a shared PID namespace) and
 * exits 0 on SIGINT/SIGTERM so that sandbox teardown is quick.
 * Built with `gcc -static` so the image needs no libc.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void sigdown(int signo) {
    (void)signo;
    _exit(0);
}

static void sigreap(int signo) {
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        printf("autonomic-testbed pause 1\n");
        return 0;
    }
    if (getpid() != 1) {
        fprintf(stderr, "Warning: pause should be the first process\n");
    }

    struct sigaction down = {0};
    down.sa_handler = sigdown;
    if (sigaction(SIGINT, &down, NULL) < 0 || sigaction(SIGTERM, &down, NULL) < 0) {
        perror("sigaction");
        return 1;
    }
    struct sigaction reap = {0};
    reap.sa_handler = sigreap;
    reap.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &reap, NULL) < 0) {
        perror("sigaction");
        return 2;
    }

    for (;;) {
        pause();
    }
    return 42; /* not reached */
}
