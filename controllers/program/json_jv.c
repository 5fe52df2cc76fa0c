/* The json controller's jv.c, compiled into this controller (its sources stay in controllers/json). */
#include "../json/jv.c"
