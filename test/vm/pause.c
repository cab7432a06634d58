/*
 * Minimal pod-sandbox "pause" program for the VM test harness image
 * localhost/resize-agent/pause:latest. It sleeps until SIGTERM/SIGINT (then
 * exits 0) and, as PID 1 of a pod, reaps any zombie children.
 * Built by test/vm/vm.sh prepare with: gcc -static -Os -o pause pause.c
 */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig)
{
	(void)sig;
	_exit(0);
}

static void on_chld(int sig)
{
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

int main(void)
{
	struct sigaction sa;

	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0;
	sa.sa_handler = on_term;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	sa.sa_handler = on_chld;
	sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	sigaction(SIGCHLD, &sa, NULL);

	for (;;)
		pause();
	return 0;
}
