/* The grammar controller's json_term.c (%json{...} on the json matcher, whose sources json_*.c here compile in). */
#include "../grammar/json_term.c"
