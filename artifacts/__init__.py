"""The raw-artifact contract: ids (artifacts.ids), where each artifact lives (artifacts.layout), what each
document holds (artifacts.documents) and how artifacts are written, once and atomically (artifacts.store).

Writers (tasks/) and the warehouse's readers (warehouse/kinds/) both go through it. It sits between the
measurement and the warehouse and imports neither: spec -> launch -> cells -> artifacts -> warehouse.
"""
