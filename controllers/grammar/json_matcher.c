/* The json controller's matcher.c, compiled into this controller for %json{...} (its sources stay in controllers/json). */
#include "../json/matcher.c"
