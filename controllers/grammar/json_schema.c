/* The json controller's schema.c, compiled into this controller for %json{...} (its sources stay in controllers/json). */
#include "../json/schema.c"
