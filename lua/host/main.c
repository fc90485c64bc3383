/* main.c -- STUB: the ember command (to be replaced). */
#include <stdio.h>
int main(void) { puts("ember: not built yet"); return 1; }
